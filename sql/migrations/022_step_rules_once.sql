-- The rules of a claim and an outcome have one definition, jobs_step's: the
-- lone ask (jobs_step_one) is a batch of one, so each rule is written once
-- and a lone ask gets the answer of a batch of that one ask.
--
-- The rules, as jobs_step holds them:
-- - an outcome is written while its row is still started by this claim, or
--   already holds this very outcome (so sending it twice is safe); it takes
--   the row with SKIP LOCKED;
-- - a throttling outcome takes its queue's turn (jobs_queue_turn) and gate
--   row without waiting, and holds them until it commits, so no claim reads
--   the gate in between;
-- - an outcome that cannot have its row, turn or gate row this moment, and
--   is still this claim's, is answered "look again shortly" (its row: queue
--   NULL, the job's id, wait 0.05);
-- - a claim takes its queue's turn without waiting (held: wait 0.05), then
--   reads the gate (pause, throttle) and the free slots after it, so an
--   outcome that moved them has committed; a paused or throttled queue
--   answers the gate's wait, every slot taken no wait;
-- - rows are claimed as a prefix of the queue's order (priority, then
--   run_at, then id, or the job asked for): never job n+1 while job n is due
--   and not started, so a head row another transaction holds stops the
--   claim (wait 0.05); with nothing due, the wait is until the queue's next
--   pending row is due.
--
-- Nothing here waits on a lock, so one busy queue or one held row never
-- stalls the other asks of a batch.

-- The first key of every queue's turn, pg_advisory_xact_lock(key, hashtext(queue)).
-- IMMUTABLE: the planner folds it to its value.
CREATE OR REPLACE FUNCTION jobs_queue_turn_key() RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 1785684595 $$;

-- Rows: one per outcome written (queue NULL, the job's id) or held back (and
-- wait 0.05); one per job claimed (queue, worker_id and slot set); and one of
-- NULLs for each (queue, worker) that claimed nothing, whose wait says how
-- long until its queue may have work (NULL: not known; 0.05: look again shortly).
CREATE OR REPLACE FUNCTION jobs_step(
  o_ids bigint[], o_workers text[], o_attempts int[], o_statuses text[], o_retry_ins float8[],
  o_last_errors text[], o_tracebacks text[], o_delays float8[], o_uncounted int[],
  c_queues text[], c_slots int[], c_workers text[], c_leases float8[], c_max_attempts int[], c_ids bigint[]
) RETURNS TABLE (queue text, worker_id text, id bigint, name text, args text, attempts int, max_attempts int,
                 callsite text, latency float8, wait float8, slot int)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
  throttled text;
  busy text[];
  -- Queues whose throttling outcomes wait for another try: their turn or gate row is held.
  held_queues text[] := '{}';
BEGIN
  IF cardinality(o_ids) > 0 THEN
    -- A throttling outcome takes its queue's turn (the claim's, below) until it
    -- commits, so no claim reads the gate in between; and the queue's gate row.
    -- Neither is waited for.
    IF 0 < ANY(o_delays) THEN  -- an expression, not a query: the common case costs nothing
      FOR throttled IN
        SELECT DISTINCT j.queue FROM jobs j JOIN unnest(o_ids, o_delays) o(id, delay) ON j.id = o.id
        WHERE o.delay > 0 ORDER BY j.queue
      LOOP
        IF NOT pg_try_advisory_xact_lock(jobs_queue_turn_key(), hashtext(throttled)) THEN
          held_queues := held_queues || throttled;
          CONTINUE;
        END IF;
        PERFORM FROM job_queues jq WHERE jq.queue = throttled FOR UPDATE SKIP LOCKED;
        IF NOT FOUND AND EXISTS (SELECT FROM job_queues jq WHERE jq.queue = throttled) THEN
          held_queues := held_queues || throttled;
        END IF;
      END LOOP;
    END IF;
    RETURN QUERY
    WITH o AS (
      SELECT * FROM unnest(o_ids, o_workers, o_attempts, o_statuses, o_retry_ins, o_last_errors,
                           o_tracebacks, o_delays, o_uncounted)
        AS o(id, worker_id, attempts, status, retry_in, last_error, traceback, delay, uncounted)
    ),
    mine AS (
      -- The rows this batch may write now: still this claim's (or holding this
      -- very outcome), not held by another transaction, and not a throttling
      -- outcome of a queue whose turn or gate row is held.
      SELECT j.id FROM jobs j JOIN o ON j.id = o.id
      WHERE j.worker_id = o.worker_id AND j.attempts = o.attempts AND j.status IN ('started', o.status)
        AND NOT (o.delay > 0 AND j.queue = ANY(held_queues))
      FOR UPDATE OF j SKIP LOCKED
    ),
    done AS (
      UPDATE jobs j
      SET status = o.status,
          finished_at = CASE WHEN o.retry_in IS NULL THEN now() END,
          -- A retry waits retry_in; an interrupted job (retry_in 0) keeps its place in the queue.
          run_at = CASE WHEN coalesce(o.retry_in, 0) = 0 THEN j.run_at
                        ELSE now() + make_interval(secs => o.retry_in) END,
          last_error = coalesce(o.last_error, j.last_error),
          -- Goes with last_error: a new error replaces it (with NULL when it has none).
          last_traceback = CASE WHEN o.last_error IS NULL THEN j.last_traceback ELSE o.traceback END,
          -- An attempt that did not count (a snooze) gives its allowance back.
          max_attempts = j.max_attempts + o.uncounted,
          lease_until = NULL, slot = NULL
      FROM o
      WHERE j.id = o.id AND j.id IN (SELECT mine.id FROM mine)
      RETURNING j.id, j.queue, o.delay
    ),
    gated AS (
      INSERT INTO job_queues (queue, next_claim_at)
      SELECT done.queue, now() + make_interval(secs => max(done.delay)) FROM done
      WHERE done.delay > 0
      GROUP BY done.queue
      ON CONFLICT (queue) DO UPDATE SET next_claim_at = excluded.next_claim_at
    ),
    waiting AS (
      -- Still this claim's but not written: held by another transaction, or its
      -- queue's turn is. Asked again by the worker.
      SELECT j.id FROM jobs j JOIN o ON j.id = o.id
      WHERE j.worker_id = o.worker_id AND j.attempts = o.attempts AND j.status IN ('started', o.status)
        AND j.id NOT IN (SELECT mine.id FROM mine)
    )
    SELECT NULL::text, NULL::text, done.id, NULL::text, NULL::text, NULL::int, NULL::int, NULL::text,
           NULL::float8, NULL::float8, NULL::int
    FROM done
    UNION ALL
    SELECT NULL::text, NULL::text, waiting.id, NULL::text, NULL::text, NULL::int, NULL::int, NULL::text,
           NULL::float8, 0.05::float8, NULL::int
    FROM waiting;
  END IF;
  IF cardinality(c_queues) = 0 THEN
    RETURN;
  END IF;
  -- Each queue's turn (jobs_queue_turn), never waited for: the queues whose
  -- turn another transaction holds now.
  SELECT array_agg(t.q) FILTER (WHERE NOT t.mine) INTO busy
  FROM (SELECT d.q, pg_try_advisory_xact_lock(jobs_queue_turn_key(), hashtext(d.q)) AS mine
        FROM (SELECT DISTINCT u.q FROM unnest(c_queues) u(q)) d) t;
  -- A statement after the locks: its snapshot holds what committed before them.
  RETURN QUERY
  WITH ask AS (
    SELECT c.q, c.s, c.w, c.l, c.m, c.i
    FROM unnest(c_queues, c_slots, c_workers, c_leases, c_max_attempts, c_ids) AS c(q, s, w, l, m, i)
  ),
  grp AS (
    SELECT a.q, a.w, a.l, a.m, a.i,
           a.q = ANY(coalesce(busy, '{}')) AS busy,
           (SELECT greatest(jq.paused_until, jq.next_claim_at) FROM job_queues jq WHERE jq.queue = a.q) AS gate,
           -- The database holds the queue to its concurrency: a slot number
           -- is free when no started row of the queue, of any process, holds it.
           array_agg(a.s ORDER BY a.s) FILTER (
             WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE j.queue = a.q AND j.status = 'started' AND j.slot = a.s)
           ) AS free
    FROM ask a
    GROUP BY a.q, a.w, a.l, a.m, a.i
  ),
  heads AS (
    SELECT g.q, g.w, g.l, g.m, g.free, h.id, h.n
    FROM grp g
    CROSS JOIN LATERAL (
      SELECT o.id, row_number() OVER (ORDER BY o.priority DESC, o.run_at, o.id)::int AS n
      FROM (SELECT j.id, j.priority, j.run_at FROM jobs j
            WHERE j.queue = g.q AND j.status = 'pending' AND j.run_at <= now()
              AND j.id = coalesce(g.i, j.id)  -- not an OR: that makes the generic plan look dear
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT cardinality(g.free)) o
    ) h
    WHERE NOT g.busy AND g.free IS NOT NULL AND NOT coalesce(g.gate > now(), false)
  ),
  locked AS (
    SELECT j.id FROM jobs j
    WHERE j.id IN (SELECT heads.id FROM heads) AND j.status = 'pending'
    FOR UPDATE SKIP LOCKED
  ),
  picked AS (
    -- The prefix of each queue's order that could be locked: never job n+1
    -- while job n is due and not started.
    SELECT h.* FROM heads h
    WHERE NOT EXISTS (SELECT 1 FROM heads e
                      WHERE e.q = h.q AND e.w = h.w AND e.n <= h.n
                        AND NOT EXISTS (SELECT 1 FROM locked k WHERE k.id = e.id))
  ),
  claimed AS (
    UPDATE jobs j
    SET status = 'started', started_at = now(), finished_at = NULL,
        attempts = j.attempts + 1,
        max_attempts = coalesce(j.max_attempts, p.m),
        worker_id = p.w, slot = p.free[p.n],
        -- From the moment of the claim, not the transaction's start.
        lease_until = clock_timestamp() + make_interval(secs => p.l)
    FROM picked p
    WHERE j.id = p.id
    -- args as text: decoded by the worker, which can end a row whose args it cannot read.
    RETURNING p.q, p.w, j.id, j.name, j.args::text, j.attempts, j.max_attempts, j.callsite,
              greatest(extract(EPOCH FROM now() - j.run_at), 0)::float8, NULL::float8, p.free[p.n]
  )
  SELECT * FROM claimed
  UNION ALL
  SELECT g.q, g.w, NULL::bigint, NULL::text, NULL::text, NULL::int, NULL::int, NULL::text, NULL::float8,
         CASE
           WHEN g.busy THEN 0.05::float8
           -- a pause may be infinite
           WHEN g.gate > now() THEN extract(EPOCH FROM least(g.gate, now() + interval '1 day') - now())::float8
           WHEN g.free IS NULL THEN NULL::float8  -- every slot asked for is taken
           WHEN EXISTS (SELECT 1 FROM heads h WHERE h.q = g.q AND h.w = g.w) THEN 0.05::float8  -- its head is held
           ELSE extract(EPOCH FROM (SELECT min(j.run_at) FROM jobs j
                                    WHERE j.queue = g.q AND j.status = 'pending' AND j.run_at > now()) - now())::float8
         END,
         NULL::int
  FROM grp g
  WHERE NOT EXISTS (SELECT 1 FROM claimed c WHERE c.q = g.q AND c.w = g.w);
END
$$;

-- One ask, each field a plain value: a NULL o_id sends no outcome, a NULL
-- c_queue no claim. The answer is jobs_step's for that one ask, but for an
-- outcome held back: its row, without the claim's wait, since the slot is
-- still the job's and the claim has nothing to tell.
CREATE OR REPLACE FUNCTION jobs_step_one(
  o_id bigint, o_worker text, o_attempts int, o_status text, o_retry_in float8,
  o_last_error text, o_traceback text, o_delay float8, o_uncounted int,
  c_queue text, c_slot int, c_worker text, c_lease float8, c_max_attempts int, c_id bigint
) RETURNS TABLE (queue text, worker_id text, id bigint, name text, args text, attempts int, max_attempts int,
                 callsite text, latency float8, wait float8, slot int)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
  o boolean := o_id IS NOT NULL;
  c boolean := c_queue IS NOT NULL;
BEGIN
  RETURN QUERY
  WITH s AS (
    SELECT * FROM jobs_step(
      CASE WHEN o THEN ARRAY[o_id] ELSE ARRAY[]::bigint[] END, CASE WHEN o THEN ARRAY[o_worker] ELSE ARRAY[]::text[] END,
      CASE WHEN o THEN ARRAY[o_attempts] ELSE ARRAY[]::int[] END, CASE WHEN o THEN ARRAY[o_status] ELSE ARRAY[]::text[] END,
      CASE WHEN o THEN ARRAY[o_retry_in] ELSE ARRAY[]::float8[] END, CASE WHEN o THEN ARRAY[o_last_error] ELSE ARRAY[]::text[] END,
      CASE WHEN o THEN ARRAY[o_traceback] ELSE ARRAY[]::text[] END, CASE WHEN o THEN ARRAY[o_delay] ELSE ARRAY[]::float8[] END,
      CASE WHEN o THEN ARRAY[o_uncounted] ELSE ARRAY[]::int[] END,
      CASE WHEN c THEN ARRAY[c_queue] ELSE ARRAY[]::text[] END, CASE WHEN c THEN ARRAY[c_slot] ELSE ARRAY[]::int[] END,
      CASE WHEN c THEN ARRAY[c_worker] ELSE ARRAY[]::text[] END, CASE WHEN c THEN ARRAY[c_lease] ELSE ARRAY[]::float8[] END,
      CASE WHEN c THEN ARRAY[c_max_attempts] ELSE ARRAY[]::int[] END, CASE WHEN c THEN ARRAY[c_id] ELSE ARRAY[]::bigint[] END)
  )
  SELECT * FROM s
  WHERE s.queue IS NULL OR s.id IS NOT NULL
     OR NOT EXISTS (SELECT FROM s h WHERE h.queue IS NULL AND h.wait IS NOT NULL);
END
$$;
