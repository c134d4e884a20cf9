-- The rules a lone ask (jobs_step_one) and a batch (jobs_step) both apply are
-- functions of their own, each written once: a queue's turn, a throttling
-- outcome's turn and gate row, whether an outcome is still its claim's, the
-- gate and its wait, a slot's holder, the due jobs in the queue's order, and
-- the wait until the next one. jobs_step and jobs_step_one (018) are
-- redefined to call them; what is left in each is how it goes through its
-- asks (one, or a set of them in a few statements), and tests/db/test_step_one.py
-- holds the two to the same answers.
--
-- The SQL functions here are inlined: the planner puts their bodies in place
-- of their calls, so the statements that call them run as if written out.
-- That holds while each is one SELECT, neither STRICT nor with a SET clause,
-- and a STABLE one calls nothing volatile (a set-returning one is inlined
-- only in FROM).

-- A queue's turn: an advisory transaction lock, never waited for. A claim
-- takes it before it reads the gate, and a throttling outcome holds it until
-- it commits, so no claim reads the gate in between. The one place its key is
-- spelled (lib.store.group_commit.QUEUE_TURN_KEY in Python).
CREATE FUNCTION jobs_queue_turn(queue text) RETURNS boolean
LANGUAGE sql AS $$ SELECT pg_try_advisory_xact_lock(1785684595, hashtext(queue)) $$;

-- A throttling outcome takes its queue's turn and its gate row, neither waited
-- for: false when another transaction holds either, and the outcome is not
-- written this time.
CREATE FUNCTION jobs_throttle_turn(q text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
  IF NOT jobs_queue_turn(q) THEN
    RETURN false;
  END IF;
  PERFORM FROM job_queues jq WHERE jq.queue = q FOR UPDATE SKIP LOCKED;
  RETURN FOUND OR NOT EXISTS (SELECT FROM job_queues jq WHERE jq.queue = q);
END
$$;

-- An outcome is written while its row is still started by its claim (the
-- same worker and attempt), or already holds this very outcome, so sending it
-- twice is safe.
CREATE FUNCTION jobs_outcome_current(
  row_worker text, row_attempts int, row_status text, o_worker text, o_attempts int, o_status text
) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
  SELECT row_worker = o_worker AND row_attempts = o_attempts AND row_status IN ('started', o_status)
$$;

-- Seconds until a gate (pause, throttle) opens; a pause may be infinite, and
-- is then looked at again in a day.
CREATE FUNCTION jobs_gate_wait(gate timestamptz) RETURNS float8
LANGUAGE sql STABLE AS $$ SELECT extract(EPOCH FROM least(gate, now() + interval '1 day') - now())::float8 $$;

-- The gate a claim reads after its queue's turn: the later of a pause and
-- the throttle's next claim; NULL, or no row, for an open queue.
CREATE FUNCTION jobs_gate(q text) RETURNS TABLE (gate timestamptz)
LANGUAGE sql STABLE AS $$
  SELECT greatest(jq.paused_until, jq.next_claim_at) FROM job_queues jq WHERE jq.queue = q
$$;

-- The database holds a queue to its concurrency: a slot number is free when
-- no started row of the queue, of any process, holds it.
CREATE FUNCTION jobs_slot_holder(q text, s int) RETURNS SETOF bigint
LANGUAGE sql STABLE AS $$
  SELECT j.id FROM jobs j WHERE j.queue = q AND j.status = 'started' AND j.slot = s
$$;

-- The queue's first n due jobs in its order (priority, then run_at, then
-- id), or the job asked for when it is due. A claim takes a prefix of them:
-- never job n+1 while job n is due and not started.
CREATE FUNCTION jobs_due(q text, asked bigint, n int) RETURNS TABLE (id bigint, priority int, run_at timestamptz)
LANGUAGE sql STABLE AS $$
  SELECT j.id, j.priority, j.run_at FROM jobs j
  WHERE j.queue = q AND j.status = 'pending' AND j.run_at <= now()
    AND j.id = coalesce(asked, j.id)  -- not an OR: that makes the generic plan look dear
  ORDER BY j.priority DESC, j.run_at, j.id
  LIMIT n
$$;

-- With nothing due, the seconds until the queue's next pending row is due
-- (NULL when it has none).
CREATE FUNCTION jobs_next_due_wait(q text) RETURNS TABLE (wait float8)
LANGUAGE sql STABLE AS $$
  SELECT extract(EPOCH FROM min(j.run_at) - now())::float8 FROM jobs j
  WHERE j.queue = q AND j.status = 'pending' AND j.run_at > now()
$$;

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
      -- outcome of a queue whose turn or gate row is held.
      SELECT j.id FROM jobs j JOIN o ON j.id = o.id
      WHERE jobs_outcome_current(j.worker_id, j.attempts, j.status, o.worker_id, o.attempts, o.status)
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
      WHERE jobs_outcome_current(j.worker_id, j.attempts, j.status, o.worker_id, o.attempts, o.status)
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
  FROM (SELECT d.q, jobs_queue_turn(d.q) AS mine
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
           (SELECT jg.gate FROM jobs_gate(a.q) jg) AS gate,
           array_agg(a.s ORDER BY a.s) FILTER (WHERE NOT EXISTS (SELECT FROM jobs_slot_holder(a.q, a.s))) AS free
    FROM ask a
    GROUP BY a.q, a.w, a.l, a.m, a.i
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

-- jobs_step for one ask, each field a plain value. An outcome held back is
-- answered with wait 0.05 and no claim is tried: the slot is still the job's.
CREATE OR REPLACE FUNCTION jobs_step_one(
  o_id bigint, o_worker text, o_attempts int, o_status text, o_retry_in float8,
  o_last_error text, o_traceback text, o_delay float8, o_uncounted int,
  c_queue text, c_slot int, c_worker text, c_lease float8, c_max_attempts int, c_id bigint
) RETURNS TABLE (queue text, worker_id text, id bigint, name text, args text, attempts int, max_attempts int,
                 callsite text, latency float8, wait float8, slot int)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
  done_queue text;
  gate timestamptz;
  head bigint;
  held boolean := false;
BEGIN
  IF o_id IS NOT NULL THEN
    IF o_delay > 0 THEN
      SELECT j.queue INTO done_queue FROM jobs j WHERE j.id = o_id;
      held := NOT jobs_throttle_turn(done_queue);
    END IF;
    IF NOT held THEN
      UPDATE jobs j
      SET status = o_status,
          finished_at = CASE WHEN o_retry_in IS NULL THEN now() END,
          run_at = CASE WHEN coalesce(o_retry_in, 0) = 0 THEN j.run_at
                        ELSE now() + make_interval(secs => o_retry_in) END,
          last_error = coalesce(o_last_error, j.last_error),
          last_traceback = CASE WHEN o_last_error IS NULL THEN j.last_traceback ELSE o_traceback END,
          max_attempts = j.max_attempts + o_uncounted,
          lease_until = NULL, slot = NULL
      WHERE j.id = (SELECT k.id FROM jobs k WHERE k.id = o_id FOR UPDATE SKIP LOCKED)
        AND jobs_outcome_current(j.worker_id, j.attempts, j.status, o_worker, o_attempts, o_status)
      RETURNING j.queue INTO done_queue;
      IF FOUND THEN
        IF o_delay > 0 THEN
          INSERT INTO job_queues (queue, next_claim_at) VALUES (done_queue, now() + make_interval(secs => o_delay))
          ON CONFLICT (queue) DO UPDATE SET next_claim_at = excluded.next_claim_at;
        END IF;
        id := o_id;  -- the outcome's row: its id alone
        RETURN NEXT;
        id := NULL;
      ELSE
        -- Not written: the row is another claim's now (rescued), or another transaction holds it.
        held := EXISTS (SELECT FROM jobs j WHERE j.id = o_id
                        AND jobs_outcome_current(j.worker_id, j.attempts, j.status, o_worker, o_attempts, o_status));
      END IF;
    END IF;
    IF held THEN
      id := o_id;
      wait := 0.05;
      RETURN NEXT;
      RETURN;
    END IF;
  END IF;
  IF c_queue IS NULL THEN
    RETURN;
  END IF;
  -- The claim's row: its queue and worker, and the job claimed or the wait.
  queue := c_queue;
  worker_id := c_worker;
  IF NOT jobs_queue_turn(c_queue) THEN
    wait := 0.05;
    RETURN NEXT;
    RETURN;
  END IF;
  -- Statements after the lock: their snapshots hold what committed before it.
  SELECT jg.gate INTO gate FROM jobs_gate(c_queue) jg;
  IF gate > now() THEN
    wait := jobs_gate_wait(gate);
    RETURN NEXT;
    RETURN;
  END IF;
  IF EXISTS (SELECT FROM jobs_slot_holder(c_queue, c_slot)) THEN
    RETURN NEXT;  -- the slot is taken: no wait known
    RETURN;
  END IF;
  SELECT d.id INTO head FROM jobs_due(c_queue, c_id, 1) d;
  IF head IS NULL THEN
    SELECT nd.wait INTO wait FROM jobs_next_due_wait(c_queue) nd;
    RETURN NEXT;
    RETURN;
  END IF;
  -- The head only: when another transaction holds it, nothing, never the row behind it.
  UPDATE jobs j
  SET status = 'started', started_at = now(), finished_at = NULL,
      attempts = j.attempts + 1,
      max_attempts = coalesce(j.max_attempts, c_max_attempts),
      worker_id = c_worker, slot = c_slot,
      lease_until = clock_timestamp() + make_interval(secs => c_lease)
  WHERE j.id = (SELECT k.id FROM jobs k WHERE k.id = head AND k.status = 'pending' FOR UPDATE SKIP LOCKED)
  RETURNING j.id, j.name, j.args::text, j.attempts, j.max_attempts, j.callsite,
            greatest(extract(EPOCH FROM now() - j.run_at), 0)
  INTO id, name, args, attempts, max_attempts, callsite, latency;
  IF FOUND THEN
    slot := c_slot;
  ELSE
    wait := 0.05;  -- its head is held
  END IF;
  RETURN NEXT;
END
$$;
