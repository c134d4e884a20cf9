-- jobs_step locks a batch's heads by key, whatever the table's statistics say.
--
-- Its lock of the heads joined jobs with the heads' ids. The heads' count is
-- only known when the step runs (a queue's free slots), so the planner took
-- a tenth of the queue's due rows: with a backlog, hundreds of heads, and a
-- hash join over a scan of the whole table was the cheaper plan: each batch
-- read every row of the table, pending and finished, to lock a few. The
-- heads now go as an array, which the planner takes for a few values, each
-- looked up by the primary key. Everything else is as in 030.
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
  -- The queues asked for that have a rate: claimed ask by ask, below.
  rated text[];
  r record;
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
        IF NOT jobs_throttle_turn(throttled) THEN
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
      -- outcome of a queue whose turn or gate row is held; each with its outcome.
      SELECT j.id, o.status, o.retry_in, o.last_error, o.traceback, o.delay, o.uncounted
      FROM jobs j JOIN o ON j.id = o.id
      WHERE jobs_outcome_current(j.worker_id, j.attempts, j.status, o.worker_id, o.attempts, o.status)
        AND NOT (o.delay > 0 AND j.queue = ANY(held_queues))
      FOR UPDATE OF j SKIP LOCKED
    ),
    done AS (
      UPDATE jobs j
      SET status = m.status,
          finished_at = CASE WHEN m.retry_in IS NULL THEN now() END,
          -- A retry waits retry_in; an interrupted job (retry_in 0) keeps its place in the queue.
          run_at = CASE WHEN coalesce(m.retry_in, 0) = 0 THEN j.run_at
                        ELSE now() + make_interval(secs => m.retry_in) END,
          last_error = coalesce(m.last_error, j.last_error),
          -- Goes with last_error: a new error replaces it (with NULL when it has none).
          last_traceback = CASE WHEN m.last_error IS NULL THEN j.last_traceback ELSE m.traceback END,
          attempt_errors = jobs_attempt_errors(j.attempt_errors, j.status, j.attempts, j.worker_id, m.last_error, m.traceback),
          -- An attempt that did not count (a snooze) gives its allowance back.
          max_attempts = j.max_attempts + m.uncounted,
          lease_until = NULL, slot = NULL
      FROM mine m
      WHERE j.id = m.id
      RETURNING j.id, j.queue, m.delay
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
      -- queue's turn is. Asked again by the worker. Only the outcomes not
      -- written are looked up (the filter is on o, not on the row).
      SELECT j.id FROM o JOIN jobs j ON j.id = o.id
      WHERE o.id NOT IN (SELECT mine.id FROM mine)
        AND jobs_outcome_current(j.worker_id, j.attempts, j.status, o.worker_id, o.attempts, o.status)
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
  -- turn another transaction holds now; and, in the same statement, the
  -- queues with a rate (job_queues' key).
  SELECT array_agg(t.q) FILTER (WHERE NOT t.mine), coalesce(array_agg(t.q) FILTER (WHERE t.rated), '{}')
  INTO busy, rated
  FROM (SELECT d.q, jobs_queue_turn(d.q) AS mine,
               EXISTS (SELECT FROM job_queues jq WHERE jq.queue = d.q AND jq.rate_key IS NOT NULL) AS rated
        FROM (SELECT DISTINCT u.q FROM unnest(c_queues) u(q)) d) t;
  -- A queue with a rate claims ask by ask, each through jobs_step_one, so
  -- each claim takes from its rate's row before the next claim reads it (two
  -- queues of this batch may share one).
  IF cardinality(rated) > 0 THEN
    FOR r IN
      SELECT c.q, c.s, c.w, c.l, c.m, c.i
      FROM unnest(c_queues, c_slots, c_workers, c_leases, c_max_attempts, c_ids) AS c(q, s, w, l, m, i)
      WHERE c.q = ANY(rated)
    LOOP
      RETURN QUERY SELECT * FROM jobs_step_one(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                                               r.q, r.s, r.w, r.l, r.m, r.i);
    END LOOP;
  END IF;
  -- A statement after the locks: its snapshot holds what committed before them.
  RETURN QUERY
  WITH ask AS (
    SELECT c.q, c.s, c.w, c.l, c.m, c.i
    FROM unnest(c_queues, c_slots, c_workers, c_leases, c_max_attempts, c_ids) AS c(q, s, w, l, m, i)
    WHERE NOT (c.q = ANY(rated))
  ),
  grp AS (
    SELECT a.q, a.w, a.l, a.m, a.i,
           a.q = ANY(coalesce(busy, '{}')) AS busy,
           jg.gate,
           -- A slot from the concurrency set at run time up is not free.
           array_agg(a.s ORDER BY a.s) FILTER (WHERE NOT EXISTS (SELECT FROM jobs_slot_holder(a.q, a.s))
                                                 AND a.s < coalesce(jg.scaled_to, a.s + 1)) AS free
    FROM ask a
    LEFT JOIN LATERAL jobs_gate(a.q) jg ON true
    GROUP BY a.q, a.w, a.l, a.m, a.i, jg.gate, jg.scaled_to
  ),
  heads AS (
    SELECT g.q, g.w, g.l, g.m, g.free, h.id, h.n
    FROM grp g
    CROSS JOIN LATERAL (
      SELECT o.id, row_number() OVER (ORDER BY o.priority DESC, o.run_at, o.id)::int AS n
      FROM jobs_due(g.q, g.i, cardinality(g.free)) o
    ) h
    WHERE NOT g.busy AND g.free IS NOT NULL AND NOT coalesce(g.gate > now(), false)
  ),
  locked AS (
    -- The heads looked up by key, one by one (an array of ids is estimated
    -- at a few): a join with heads, estimated from a long queue's backlog,
    -- was planned as a scan of the whole table.
    SELECT j.id FROM jobs j
    WHERE j.id = ANY (ARRAY(SELECT heads.id FROM heads)) AND j.status = 'pending'
    FOR UPDATE SKIP LOCKED
  ),
  -- Each queue's first head that could not be locked: none of its order
  -- from there on is claimed, never job n+1 while job n is due and not started.
  stuck AS (
    SELECT e.q, e.w, min(e.n) AS n FROM heads e
    WHERE e.id NOT IN (SELECT k.id FROM locked k)
    GROUP BY e.q, e.w
  ),
  picked AS (
    -- The prefix of each queue's order that could be locked.
    SELECT h.* FROM heads h LEFT JOIN stuck x ON x.q = h.q AND x.w = h.w
    WHERE x.n IS NULL OR h.n < x.n
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
           WHEN g.gate > now() THEN jobs_gate_wait(g.gate)
           WHEN g.free IS NULL THEN NULL::float8  -- every slot asked for is taken
           WHEN EXISTS (SELECT 1 FROM heads h WHERE h.q = g.q AND h.w = g.w) THEN 0.05::float8  -- its head is held
           ELSE (SELECT nd.wait FROM jobs_next_due_wait(g.q) nd)
         END,
         NULL::int
  FROM grp g
  WHERE NOT EXISTS (SELECT 1 FROM claimed c WHERE c.q = g.q AND c.w = g.w);
END
$$;
