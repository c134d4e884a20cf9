-- The claim and the outcome write as one function, jobs_step, so that one
-- round trip can carry the outcomes and next claims of many queues
-- (lib/store/group_commit.py), and so that a claim reads its queue's state after it has
-- taken the queue's turn, not from a snapshot taken before another process's
-- outcome committed. A lone claim or outcome is a batch of one (sql/jobs.sql:
-- job_claim), so each rule is written once.
--
-- It runs its statements on generic plans (plan_cache_mode): left to choose,
-- Postgres plans them afresh on every call, which costs more than running
-- them (docs/performance.md).
--
-- The outcomes come first, by primary key (terminal, or back to pending for
-- a retry), holding each queue's next claim back by its throttle's delay.
-- Safe to run twice: a row matches while still started by this claim, or
-- already holding this very outcome.
--
-- Claims of one queue take turns, across every process, on an advisory lock
-- of the queue (jobs_queue_turn), which an outcome that throttles the queue
-- holds too: the gate (pause, throttle) and the free slots are read once the
-- turn is taken, after any outcome that moved them has committed. Nothing
-- here waits on a lock: a queue whose turn another claim or outcome holds
-- this moment, or whose head row another transaction holds, answers "look
-- again shortly" (wait 0.05) and claims nothing, so one busy queue never
-- stalls a batch of many. Rows are only ever claimed as a prefix of the
-- queue's order: never job n+1 while job n is due and not started. The
-- claims of all the batch's queues take two statements, whatever their
-- number: one takes the turns, one claims for every queue whose turn it has.
--
-- Rows: one per outcome written (queue NULL, the job's id); one per job
-- claimed (queue, worker_id and slot set); and one of NULLs for each (queue,
-- worker) that claimed nothing, whose wait says how long until its queue may
-- have work (NULL: not known; 0.05: look again shortly).
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
BEGIN
  -- The tests of cardinality are expressions, not queries: they cost next to nothing.
  IF cardinality(o_ids) > 0 THEN
    -- A throttling outcome takes its queue's turn (the claim's, below) until it
    -- commits: no claim reads the gate in between. In the queues' order, so two
    -- processes' outcomes never wait on each other.
    IF 0 < ANY(o_delays) THEN  -- an expression, not a query: the common case costs nothing
      FOR throttled IN
        SELECT DISTINCT j.queue FROM jobs j JOIN unnest(o_ids, o_delays) o(id, delay) ON j.id = o.id
        WHERE o.delay > 0 ORDER BY j.queue
      LOOP
        PERFORM pg_advisory_xact_lock(1785684595, hashtext(throttled));  -- jobs_queue_turn
      END LOOP;
    END IF;
    RETURN QUERY
    WITH o AS (
      SELECT * FROM unnest(o_ids, o_workers, o_attempts, o_statuses, o_retry_ins, o_last_errors,
                           o_tracebacks, o_delays, o_uncounted)
        AS o(id, worker_id, attempts, status, retry_in, last_error, traceback, delay, uncounted)
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
      WHERE j.id = o.id AND j.worker_id = o.worker_id AND j.attempts = o.attempts
        AND j.status IN ('started', o.status)
      RETURNING j.id, j.queue, o.delay
    ),
    gated AS (
      INSERT INTO job_queues (queue, next_claim_at)
      SELECT done.queue, now() + make_interval(secs => max(done.delay)) FROM done
      WHERE done.delay > 0
      GROUP BY done.queue
      ON CONFLICT (queue) DO UPDATE SET next_claim_at = excluded.next_claim_at
    )
    SELECT NULL::text, NULL::text, done.id, NULL::text, NULL::text, NULL::int, NULL::int, NULL::text,
           NULL::float8, NULL::float8, NULL::int
    FROM done;
  END IF;
  IF cardinality(c_queues) = 0 THEN
    RETURN;
  END IF;
  -- Each queue's turn (jobs_queue_turn), never waited for: the queues whose
  -- turn another transaction holds now.
  SELECT array_agg(t.q) FILTER (WHERE NOT t.mine) INTO busy
  FROM (SELECT d.q, pg_try_advisory_xact_lock(1785684595, hashtext(d.q)) AS mine
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
