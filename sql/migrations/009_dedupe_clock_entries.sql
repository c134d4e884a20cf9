-- Dedupe names that no process can switch off for another and that hold for
-- rows written before they were declared; clock ticks kept per schedule entry.

-- Mark the live rows of dedupe names just declared, as the insert trigger
-- would have had the names been declared when the rows were written. Of
-- identical live copies one is kept: a row already marked (it holds the
-- index), else a started one (it is running and cannot be taken back), else
-- the oldest. The other pending copies end as skipped. A second started copy
-- (a queue with concurrency above one may have started both) runs on
-- unmarked: it leaves the live rows when it finishes. The caller keeps other
-- writers of jobs out meanwhile. The number of copies ended.
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
CREATE OR REPLACE FUNCTION jobs_dedupe_declare(p_queue text, p_names text[], OUT added text[], OUT skipped int)
LANGUAGE plpgsql AS $$
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
  -- A writer whose insert ran before the name showed was not marked by the
  -- trigger; this waits until every such transaction has committed (so the
  -- marking below sees its rows), and holds new writers until this commits
  -- (so their trigger sees the name). It conflicts with itself, so two
  -- processes declaring at once take turns. Only a new name pays for it.
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

-- A declaration of an earlier release deleted the names it did not list, so
-- rows of a declared name may have been written unmarked while another
-- process had it deleted; they are marked here.
LOCK TABLE jobs IN SHARE ROW EXCLUSIVE MODE;
SELECT jobs_dedupe_mark(queue, array_agg(name)) FROM job_dedupe_names GROUP BY queue;

-- A schedule may hold two entries of one job name with different args (or
-- queues): a tick belongs to the entry, named by a digest of its (queue, name,
-- args) that lib/background/clock.py computes. A row with entry '' names no
-- entry (it was written when a name could have only one): the clock counts it
-- for every entry of that name until it is pruned.
ALTER TABLE clock_ticks ADD COLUMN entry text NOT NULL DEFAULT '';
ALTER TABLE clock_ticks DROP CONSTRAINT clock_ticks_pkey, ADD PRIMARY KEY (name, entry, minute);
