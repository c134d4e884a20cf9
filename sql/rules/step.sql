-- The step: the outcome of a job and the next claim of its slot, for one ask
-- (jobs_step_one) or a batch of asks of any queues (jobs_step), in one round
-- trip and one transaction (lib/run/steps.py). A claim reads its
-- queue's state after it has taken the queue's turn, not from a snapshot
-- taken before another process's outcome committed. Both apply the rules of
-- rules.sql and rates.sql, and tests/db/test_step_one.py holds the two to the
-- same answers, case by case.
--
-- Outcomes come first, by primary key (terminal, or back to pending for a
-- retry), a throttling one holding its queue's next claim back by its
-- delay. An outcome is written while its row is still started by its claim,
-- or already holds this very outcome, so sending it twice is safe.
--
-- Nothing here waits on a lock, so one row another transaction holds (a
-- person's BEGIN; UPDATE jobs ... left open, or a worker's server process
-- whose link stalled mid-statement) delays that one job alone. An outcome
-- takes its row with SKIP LOCKED, and a throttling outcome takes its queue's
-- turn and gate row without waiting: one that cannot have them this moment
-- is not written and is answered "look again shortly" (its row: queue NULL,
-- the job's id, wait 0.05), and the worker sends it again, alone. A claim
-- takes its queue's turn without waiting (busy: wait 0.05), and takes only
-- the queue's head rows with SKIP LOCKED: when another transaction holds
-- one, nothing from there on in the queue's order, never job n+1 while job n
-- is due and not started.
--
-- Rows: one per outcome written (queue NULL, the job's id); one per job
-- claimed (queue, worker_id and slot set); and one of NULLs for each (queue,
-- worker) that claimed nothing, whose wait says how long until its queue may
-- have work (NULL: not known; 0.05: look again shortly).
--
-- Both run on generic plans (plan_cache_mode): left to choose, Postgres plans
-- their statements afresh on every call, which costs more than running them.
-- And without JIT, whatever the session says (a worker behind a pooler cannot
-- turn it off for its sessions): the plans' estimates grow with the rows the
-- table keeps, not with the few each statement reads, and past jit_above_cost
-- compiling them would cost each call far more than running them.

-- One ask, each field a plain value (a NULL o_id sends no outcome; a NULL
-- c_queue, no claim): what an idle or serial worker sends on every job, so
-- it is written for that one case. Each statement a PL/pgSQL function runs
-- pays for its own executor start and end, so the common path (a serial
-- queue's outcome and its next claim) runs three: the outcome; one read of
-- the gate, the rate's key and whether the slot is taken; and the claim's
-- UPDATE, which takes the head itself. Only when it claims nothing does a
-- second look tell why: nothing due (the next due job's wait) or a head
-- another transaction holds (0.05). A queue with a rate reads its head first,
-- since the rate's row is locked only when there is a job to take from it.
-- Every statement after the queue's turn starts after the lock, so its
-- snapshot holds what committed before it.
-- A claim's row carries the job's trace context (its run's span links to
-- it): a column a release before trace contexts did not return, which only
-- a new function can add (those releases name the columns they read).
DROP FUNCTION IF EXISTS jobs_step_one(bigint, text, int, text, float8, text, text, float8, int,
                                      text, int, text, float8, int, bigint);
CREATE FUNCTION jobs_step_one(
  o_id bigint, o_worker text, o_attempts int, o_status text, o_retry_in float8,
  o_last_error text, o_traceback text, o_delay float8, o_uncounted int,
  c_queue text, c_slot int, c_worker text, c_lease float8, c_max_attempts int, c_id bigint
) RETURNS TABLE (queue text, worker_id text, id bigint, name text, args text, attempts int, max_attempts int,
                 callsite text, latency float8, wait float8, slot int, trace text)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET jit = off AS $$
#variable_conflict use_column
DECLARE
  done_queue text;
  gate timestamptz;
  head bigint;
  held boolean := false;
  taken boolean;
  rate_key text;
  rate_wait float8;
  seen pg_snapshot;  -- the snapshot the head was read in, for the next claim's cursor
  wanted boolean;  -- a poller of the queue sleeps (wakeups.sql): a claim ends that
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
  -- A slot from the concurrency set at run time up is taken.
  SELECT jg.gate, jg.rate_key,
         coalesce(c_slot >= jg.scaled_to, false) OR EXISTS (SELECT FROM jobs_slot_holder(c_queue, c_slot)),
         (SELECT jq.wake_wanted FROM job_queues jq WHERE jq.queue = c_queue)
  INTO gate, rate_key, taken, wanted
  FROM (VALUES (1)) one LEFT JOIN jobs_gate(c_queue) jg ON true;
  IF gate > now() THEN
    wait := jobs_gate_wait(gate);
    RETURN NEXT;
    RETURN;
  END IF;
  IF taken THEN
    RETURN NEXT;  -- the slot is taken, or above the concurrency set: no wait known
    RETURN;
  END IF;
  IF rate_key IS NOT NULL THEN
    SELECT d.id, pg_current_snapshot() INTO head, seen FROM jobs_due(c_queue, c_id, 1) d;
    IF head IS NULL THEN
      -- Nothing due: the poller sleeps, and asks the queue's enqueues to wake it.
      SELECT CASE WHEN c_id IS NULL THEN jobs_asleep_wait(c_queue, nd.wait) ELSE nd.wait END
      INTO wait FROM jobs_next_due_wait(c_queue) nd;
      RETURN NEXT;
      RETURN;
    END IF;
    -- The rate's row, locked until this transaction commits; held by another
    -- claim of the same rate: that claim's answer is needed first.
    SELECT rw.wait INTO rate_wait FROM jobs_rate_wait(rate_key) rw;
    IF NOT FOUND OR rate_wait > 0 THEN
      wait := coalesce(rate_wait, 0.05);
      RETURN NEXT;
      RETURN;
    END IF;
  END IF;
  -- The head only (the one read above, when there was one): when another
  -- transaction holds it, nothing, never the row behind it.
  UPDATE jobs j
  SET status = 'started', started_at = now(), finished_at = NULL,
      attempts = j.attempts + 1,
      max_attempts = coalesce(j.max_attempts, c_max_attempts),
      worker_id = c_worker, slot = c_slot,
      lease_until = clock_timestamp() + make_interval(secs => c_lease),
      claim_seq = nextval('jobs_claim_seq'), claim_slot = c_slot, claim_run_at = j.run_at,
      -- A job asked for by id is no head of the queue's order: no cursor.
      claim_snapshot = CASE WHEN c_id IS NULL THEN coalesce(seen, pg_current_snapshot()) END
  WHERE j.id = (SELECT k.id FROM jobs k
                WHERE k.id = (SELECT d.id FROM jobs_due(c_queue, coalesce(head, c_id), 1) d) AND k.status = 'pending'
                FOR UPDATE SKIP LOCKED)
  RETURNING j.id, j.name, j.args::text, j.attempts, j.max_attempts, j.callsite,
            greatest(extract(EPOCH FROM now() - j.run_at), 0), j.trace::text
  INTO id, name, args, attempts, max_attempts, callsite, latency, trace;
  IF FOUND THEN
    slot := c_slot;
    IF rate_key IS NOT NULL THEN
      PERFORM jobs_rate_take(rate_key);
    END IF;
    IF wanted THEN
      -- Awake now: enqueues of the queue notify no more, until a poller sleeps again.
      UPDATE job_queues SET wake_wanted = false
      WHERE queue = (SELECT x.queue FROM job_queues x WHERE x.queue = c_queue AND x.wake_wanted FOR UPDATE SKIP LOCKED);
    END IF;
    RETURN NEXT;
    RETURN;
  END IF;
  -- Nothing claimed: nothing due (the next due job's wait), or its head is held.
  IF head IS NULL THEN
    SELECT d.id INTO head FROM jobs_due(c_queue, c_id, 1) d;
  END IF;
  IF head IS NULL THEN
    -- Nothing due: the poller sleeps, and asks the queue's enqueues to wake it.
    SELECT CASE WHEN c_id IS NULL THEN jobs_asleep_wait(c_queue, nd.wait) ELSE nd.wait END
    INTO wait FROM jobs_next_due_wait(c_queue) nd;
  ELSE
    wait := 0.05;
  END IF;
  RETURN NEXT;
END
$$;


-- A batch of asks, each field a column: the outcomes in one statement, then
-- the claims of every queue of the batch in one more (a queue with a rate
-- claims ask by ask through jobs_step_one, so each claim takes from its
-- rate's row before the next one reads it). Each queue's claimable prefix is
-- found in time linear in the batch: the first head of each queue that could
-- not be locked, then every head before it. The outcomes carry their fields
-- into the UPDATE (mine) rather than joining the batch again, which the
-- planner, expecting a few rows of each, would run as a nested loop over
-- every pair; the outcomes not written are picked from the batch before
-- their rows are looked up. The heads are locked through an array of ids,
-- which the planner takes for a few values each looked up by the primary
-- key: their count is only known when the step runs, and a join estimated
-- from a long queue's backlog is planned as a scan of the whole table.
DROP FUNCTION IF EXISTS jobs_step(bigint[], text[], int[], text[], float8[], text[], text[], float8[], int[],
                                  text[], int[], text[], float8[], int[], bigint[]);
CREATE FUNCTION jobs_step(
  o_ids bigint[], o_workers text[], o_attempts int[], o_statuses text[], o_retry_ins float8[],
  o_last_errors text[], o_tracebacks text[], o_delays float8[], o_uncounted int[],
  c_queues text[], c_slots int[], c_workers text[], c_leases float8[], c_max_attempts int[], c_ids bigint[]
) RETURNS TABLE (queue text, worker_id text, id bigint, name text, args text, attempts int, max_attempts int,
                 callsite text, latency float8, wait float8, slot int, trace text)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET jit = off AS $$
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
           NULL::float8, NULL::float8, NULL::int, NULL::text
    FROM done
    UNION ALL
    SELECT NULL::text, NULL::text, waiting.id, NULL::text, NULL::text, NULL::int, NULL::int, NULL::text,
           NULL::float8, 0.05::float8, NULL::int, NULL::text
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
    SELECT g.q, g.w, g.l, g.m, g.free, g.i AS asked, h.id, h.n
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
    -- is planned as a scan of the whole table.
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
        lease_until = clock_timestamp() + make_interval(secs => p.l),
        claim_seq = nextval('jobs_claim_seq'), claim_slot = p.free[p.n], claim_run_at = j.run_at,
        claim_snapshot = CASE WHEN p.asked IS NULL THEN pg_current_snapshot() END
    FROM picked p
    WHERE j.id = p.id
    -- args as text: decoded by the worker, which can end a row whose args it cannot read.
    RETURNING p.q, p.w, j.id, j.name, j.args::text, j.attempts, j.max_attempts, j.callsite,
              greatest(extract(EPOCH FROM now() - j.run_at), 0)::float8, NULL::float8, p.free[p.n], j.trace::text
  ),
  woken AS (
    -- A queue that claimed is awake: its enqueues notify no more, until a
    -- poller of it sleeps again (wakeups.sql). A row another transaction
    -- holds keeps its mark: a few notifications too many.
    UPDATE job_queues jq SET wake_wanted = false
    WHERE jq.queue IN (SELECT x.queue FROM job_queues x
                       WHERE x.queue IN (SELECT c.q FROM claimed c) AND x.wake_wanted
                       FOR UPDATE SKIP LOCKED)
  )
  SELECT * FROM claimed
  UNION ALL
  SELECT g.q, g.w, NULL::bigint, NULL::text, NULL::text, NULL::int, NULL::int, NULL::text, NULL::float8,
         CASE
           WHEN g.busy THEN 0.05::float8
           WHEN g.gate > now() THEN jobs_gate_wait(g.gate)
           WHEN g.free IS NULL THEN NULL::float8  -- every slot asked for is taken
           WHEN EXISTS (SELECT 1 FROM heads h WHERE h.q = g.q AND h.w = g.w) THEN 0.05::float8  -- its head is held
           -- Nothing due: the poller sleeps, and asks the queue's enqueues to wake it.
           ELSE (SELECT CASE WHEN g.i IS NULL THEN jobs_asleep_wait(g.q, nd.wait) ELSE nd.wait END
                 FROM jobs_next_due_wait(g.q) nd)
         END,
         NULL::int, NULL::text
  FROM grp g
  WHERE NOT EXISTS (SELECT 1 FROM claimed c WHERE c.q = g.q AND c.w = g.w);
END
$$;
