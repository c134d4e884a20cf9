-- Three things a claim or an outcome now reads or writes, so the two step
-- functions (022) are redefined once for all three: a queue's rate, a
-- queue's concurrency set at run time, and every attempt's error.
--
-- Rates (lib/job/rate.py): at most `burst` jobs at once and a long-run
-- rate of one job every `spacing` seconds, across every process, decided at
-- claim by the generic cell rate algorithm. A rate's state is one moment,
-- tat (the theoretical arrival time): a claim may start a job while tat is
-- at most spacing * (burst - 1) ahead of now, and each job started moves tat
-- to greatest(tat, now) + spacing. The claim locks its rate's row (job_rates)
-- until it commits, so no two claims spend the same room; queues that name
-- one key (job_queues.rate_key) share it. Each rule written once, as in 022:
-- jobs_step_one applies the rate, and jobs_step sends a queue with a rate
-- through it ask by ask.

CREATE TABLE job_rates (
  key text PRIMARY KEY,
  spacing float8 NOT NULL CHECK (spacing > 0),
  burst int NOT NULL CHECK (burst >= 1),
  tat timestamptz NOT NULL DEFAULT '-infinity'
);

-- Declared at each worker's start with the queue's definition; NULL: no rate.
ALTER TABLE job_queues ADD COLUMN rate_key text REFERENCES job_rates (key);

-- A queue's concurrency set at run time (`worker.py scale`), for every
-- process: slots from scaled_to up claim nothing. NULL: the definition's own.
-- The definition's concurrency is the most a process runs, so the most it
-- can be set to; who set it and when, for `status`.
ALTER TABLE job_queues
  ADD COLUMN scaled_to int CHECK (scaled_to >= 1),
  ADD COLUMN scaled_by text,
  ADD COLUMN scaled_at timestamptz;

-- Each attempt's error, oldest first: {attempt, at, worker, error,
-- traceback}. Written with a failing outcome; last_error and last_traceback
-- stay the last one's, for the lists that read them.
ALTER TABLE jobs ADD COLUMN attempt_errors jsonb;

-- The gate a claim reads after its queue's turn (022), the queue's rate key and its concurrency set at run time.
DROP FUNCTION jobs_gate(text);
CREATE FUNCTION jobs_gate(q text) RETURNS TABLE (gate timestamptz, rate_key text, scaled_to int)
LANGUAGE sql STABLE AS $$
  SELECT greatest(jq.paused_until, jq.next_claim_at), jq.rate_key, jq.scaled_to FROM job_queues jq WHERE jq.queue = q
$$;

-- An outcome's error added to the attempts' errors, when the outcome has one
-- and is the attempt's first (a resent outcome is not added twice).
CREATE FUNCTION jobs_attempt_errors(
  errors jsonb, row_status text, attempt int, worker text, error text, traceback text
) RETURNS jsonb
LANGUAGE sql STABLE AS $$
  SELECT CASE WHEN error IS NULL OR row_status <> 'started' THEN errors
              ELSE coalesce(errors, '[]'::jsonb) || jsonb_build_array(jsonb_build_object(
                     'attempt', attempt, 'at', now(), 'worker', worker, 'error', error, 'traceback', traceback))
         END
$$;

-- Seconds until the rate has room for one more job (0 or less: it has now),
-- its row locked for the claim; no row when another transaction holds it.
-- FOR NO KEY UPDATE: a queue's row that names the key (a key share lock) does
-- not wait on it.
CREATE FUNCTION jobs_rate_wait(k text) RETURNS TABLE (wait float8)
LANGUAGE sql AS $$
  SELECT extract(EPOCH FROM greatest(r.tat, now()) - now())::float8 - r.spacing * (r.burst - 1)
  FROM job_rates r WHERE r.key = k
  FOR NO KEY UPDATE SKIP LOCKED
$$;

-- A job started under the rate.
CREATE FUNCTION jobs_rate_take(k text) RETURNS void
LANGUAGE sql AS $$
  UPDATE job_rates SET tat = greatest(tat, now()) + make_interval(secs => spacing) WHERE key = k
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
          attempt_errors = jobs_attempt_errors(j.attempt_errors, j.status, j.attempts, j.worker_id, o.last_error, o.traceback),
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
  scaled_to int;
  rate_key text;
  rate_wait float8;
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
          attempt_errors = jobs_attempt_errors(j.attempt_errors, j.status, j.attempts, j.worker_id, o_last_error, o_traceback),
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
  SELECT jg.gate, jg.rate_key, jg.scaled_to INTO gate, rate_key, scaled_to FROM jobs_gate(c_queue) jg;
  IF gate > now() THEN
    wait := jobs_gate_wait(gate);
    RETURN NEXT;
    RETURN;
  END IF;
  IF c_slot >= scaled_to OR EXISTS (SELECT FROM jobs_slot_holder(c_queue, c_slot)) THEN
    RETURN NEXT;  -- the slot is taken, or above the concurrency set: no wait known
    RETURN;
  END IF;
  SELECT d.id INTO head FROM jobs_due(c_queue, c_id, 1) d;
  IF head IS NULL THEN
    SELECT nd.wait INTO wait FROM jobs_next_due_wait(c_queue) nd;
    RETURN NEXT;
    RETURN;
  END IF;
  IF rate_key IS NOT NULL THEN
    -- The rate's row, locked until this transaction commits; held by another
    -- claim of the same rate: that claim's answer is needed first.
    SELECT rw.wait INTO rate_wait FROM jobs_rate_wait(rate_key) rw;
    IF NOT FOUND OR rate_wait > 0 THEN
      wait := coalesce(rate_wait, 0.05);
      RETURN NEXT;
      RETURN;
    END IF;
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
    IF rate_key IS NOT NULL THEN
      PERFORM jobs_rate_take(rate_key);
    END IF;
  ELSE
    wait := 0.05;  -- its head is held
  END IF;
  RETURN NEXT;
END
$$;
