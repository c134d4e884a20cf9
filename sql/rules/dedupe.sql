-- Dedupe, opted into per job name (job_dedupe_names): while a row of an
-- opted-in name is pending or started, a second row with the same (queue,
-- name, args) is refused by the unique index jobs_dedupe, and insert's ON
-- CONFLICT DO NOTHING returns no id. A worker declares its names at start
-- (lib/background/dedupe.py); no process can switch off a name for another.

-- Mark the live rows of dedupe names just declared, as the insert would have
-- had the names been declared when the rows were written. Of identical live
-- copies one is kept: a row already marked (it holds the index), else a
-- started one (it is running and cannot be taken back), else the oldest. The
-- other pending copies end as skipped. A second started copy (a queue with
-- concurrency above one may have started both) runs on unmarked: it leaves
-- the live rows when it finishes. The caller keeps other writers of jobs out
-- meanwhile. The number of copies ended.
CREATE OR REPLACE FUNCTION jobs_dedupe_mark(p_queue text, p_names text[]) RETURNS int
LANGUAGE sql AS $$
  WITH live AS (
    SELECT id, status, dedupe,
           first_value(id) OVER (PARTITION BY name, md5(args::text)
                                 ORDER BY dedupe DESC, status = 'started' DESC, id) AS keep
    FROM jobs
    WHERE queue = p_queue AND name = ANY(p_names) AND status IN ('pending', 'started')
  ),
  ended AS (
    UPDATE jobs j SET status = 'skip: duplicate of job ' || l.keep, finished_at = now()
    FROM live l
    WHERE j.id = l.id AND l.id <> l.keep AND l.status = 'pending'
    RETURNING j.id
  ),
  -- Disjoint from ended, so the unique index never sees two live copies.
  marked AS (
    UPDATE jobs j SET dedupe = true
    FROM live l
    WHERE j.id = l.id AND l.id = l.keep AND NOT l.dedupe
  )
  SELECT count(*)::int FROM ended
$$;

-- Add names to a queue's dedupe names; never remove one, since another
-- process (an older release, another host) may list more names than this one.
-- Returns the names that were new and the copies ended as duplicates.
--
-- Its LOCK TABLE waits for every open transaction that wrote jobs (an
-- application's, which may stay open for long), and while it waits each
-- other session's write to jobs queues behind it. With a short lock_timeout
-- it gives up instead (lock_not_available, 55P03) and its caller tries again
-- later, so writers wait for a moment at most; the same bound holds for the
-- row locks its marking waits for while it holds jobs locked. A clause of the
-- function: it holds for the function's statements alone, never for the rest
-- of the caller's transaction.
CREATE OR REPLACE FUNCTION jobs_dedupe_declare(p_queue text, p_names text[], OUT added text[], OUT skipped int)
LANGUAGE plpgsql SET lock_timeout = '100ms' AS $$
BEGIN
  added := '{}';
  skipped := 0;
  -- Every start declares its names; when they are all known, one read is the whole cost.
  IF NOT EXISTS (
    SELECT 1 FROM unnest(p_names) AS n(name)
    WHERE NOT EXISTS (SELECT 1 FROM job_dedupe_names d WHERE d.queue = p_queue AND d.name = n.name)
  ) THEN
    RETURN;
  END IF;
  -- A writer whose insert ran before the name showed did not read it; this
  -- waits until every such transaction has committed (so the marking below
  -- sees its rows), and holds new writers until this commits (so they read
  -- the name). It conflicts with itself, so two processes declaring at once
  -- take turns. Only a new name pays for it.
  LOCK TABLE jobs IN SHARE ROW EXCLUSIVE MODE;
  WITH new AS (
    INSERT INTO job_dedupe_names (queue, name)
    SELECT p_queue, unnest(p_names)
    ON CONFLICT DO NOTHING
    RETURNING name
  )
  SELECT coalesce(array_agg(name ORDER BY name), '{}') INTO added FROM new;
  IF added <> '{}' THEN
    skipped := jobs_dedupe_mark(p_queue, added);
  END IF;
END $$;
