-- The rules a claim and an outcome apply, each written once: a queue's turn,
-- a throttling outcome's turn and gate row, whether an outcome is still its
-- claim's, the gate and its wait, a slot's holder, a key's turn, the due jobs
-- in the queue's order, the wait until the next one, and each attempt's
-- error. jobs_step and jobs_step_one (step.sql) differ only in how they go
-- through their asks (one, or a set of them in a few statements), and
-- tests/db/test_step_one.py holds the two to the same answers.
--
-- The SQL functions here are inlined: the planner puts their bodies in place
-- of their calls, so the statements that call them run as if written out.
-- That holds while each is one SELECT, neither STRICT nor with a SET clause,
-- and a STABLE one calls nothing volatile (a set-returning one is inlined
-- only in FROM).

-- A queue's turn: an advisory transaction lock, never waited for. A claim
-- takes it before it reads the gate, and a throttling outcome holds it until
-- it commits, so no claim reads the gate in between. The one place its key is
-- spelled (lib.run.steps.QUEUE_TURN_KEY in Python).
CREATE OR REPLACE FUNCTION jobs_queue_turn(queue text) RETURNS boolean
LANGUAGE sql AS $$ SELECT pg_try_advisory_xact_lock(1785684595, hashtext(queue)) $$;

-- A throttling outcome takes its queue's turn and its gate row, neither waited
-- for: false when another transaction holds either, and the outcome is not
-- written this time.
CREATE OR REPLACE FUNCTION jobs_throttle_turn(q text) RETURNS boolean
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
CREATE OR REPLACE FUNCTION jobs_outcome_current(
  row_worker text, row_attempts int, row_status text, o_worker text, o_attempts int, o_status text
) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
  SELECT row_worker = o_worker AND row_attempts = o_attempts AND row_status IN ('started', o_status)
$$;

-- Seconds until a gate (pause, throttle) opens; a pause may be infinite, and
-- is then looked at again in a day.
CREATE OR REPLACE FUNCTION jobs_gate_wait(gate timestamptz) RETURNS float8
LANGUAGE sql STABLE AS $$ SELECT extract(EPOCH FROM least(gate, now() + interval '1 day') - now())::float8 $$;

-- What a claim reads after its queue's turn: the gate (the later of a pause
-- and the throttle's next claim; NULL, or no row, for an open queue), the key
-- of the queue's rate and budgets (NULL: none), and the concurrency set at
-- run time (`worker.py scale`; NULL: the definition's own).
CREATE OR REPLACE FUNCTION jobs_gate(q text) RETURNS TABLE (gate timestamptz, rate_key text, scaled_to int)
LANGUAGE sql STABLE AS $$
  SELECT greatest(jq.paused_until, jq.next_claim_at), jq.rate_key, jq.scaled_to FROM job_queues jq WHERE jq.queue = q
$$;

-- The database holds a queue to its concurrency: a slot number is free when
-- no started row of the queue, of any process, holds it. Claims of a slot
-- follow each other under the queue's turn, so its holder, if any, is its
-- newest claim: read newest first (jobs_slot_claims), one row whatever the
-- dead versions of the slot's earlier jobs a held snapshot keeps.
CREATE OR REPLACE FUNCTION jobs_slot_holder(q text, s int) RETURNS SETOF bigint
LANGUAGE sql STABLE AS $$
  SELECT l.id FROM (SELECT j.id, j.status FROM jobs j
                    WHERE j.queue = q AND j.claim_slot = s AND j.claim_seq IS NOT NULL
                    ORDER BY j.claim_seq DESC LIMIT 1) l
  WHERE l.status = 'started'
$$;

-- Whether a due job of key k is its key's turn: no job of the key is started,
-- and none is due before it in the queue's order (priority, run_at, id). The
-- jobs of one key start one at a time and in order, across every process,
-- while jobs of other keys run beside them.
CREATE OR REPLACE FUNCTION jobs_key_turn(q text, k text, p int, r timestamptz, i bigint) RETURNS boolean
LANGUAGE sql STABLE AS $$
  SELECT NOT EXISTS (SELECT FROM jobs s WHERE s.queue = q AND s.key = k AND s.status = 'started')
     AND NOT EXISTS (SELECT FROM jobs e
                     WHERE e.queue = q AND e.key = k AND e.status = 'pending' AND e.run_at <= now()
                       AND (e.priority > p OR (e.priority = p AND (e.run_at, e.id) < (r, i))))
$$;

-- The queue's first n due jobs a claim may start, in the queue's order
-- (priority, highest first, then run_at, then id: jobs_claim's order), or the
-- job asked for when it is due. A claim takes a prefix of them: never job n+1
-- while job n is due and not started. A job whose key's turn it is not is
-- passed over.
--
-- The order is read on from the queue's newest claim (jobs_claims), not from
-- its start: every head claimed before left a dead version in jobs_claim,
-- which stays while any snapshot older than it is held (a report, a
-- forgotten BEGIN, a standby's feedback), and a read from the start steps
-- over all of them. That claim took every job due before its own that its
-- snapshot showed, so a due job before it now was made pending since
-- (pending_xid, jobs_made_pending: by a transaction that snapshot could not
-- see, read through jobs_pending_xid) or was not due then (run_at after that
-- claim's now(), read through jobs_pending_due). The whole order is read when
-- there is no such claim (none yet, or one of a job asked for by id) or the
-- queue has keyed jobs waiting, which claims pass over. A claim whose job
-- was given back or redriven since has lost its moment (started_at is
-- cleared), so the one before it serves: every claim's place holds as a
-- cursor, and the job given back was made pending since.
--
-- Each part is a range of one index (the cursor's parts come in laterally,
-- so that they bound the range), the read on from it stopping at n rows. The
-- asked id's test is coalesce(j.id = asked, true), estimated at half the
-- rows, so that the ordered read of jobs_claim that stops at n rows is the
-- cheaper plan whatever the table's statistics say.
CREATE OR REPLACE FUNCTION jobs_due(q text, asked bigint, n int) RETURNS TABLE (id bigint, priority int, run_at timestamptz)
LANGUAGE sql STABLE AS $$
  WITH cursor AS MATERIALIZED (
    -- The newest claim's place in the order, or the order's start.
    SELECT coalesce(l.p, -2147483647) AS p, coalesce(l.r, '-infinity') AS r, coalesce(l.i, 0) AS i, l.s, l.t
    FROM (VALUES (1)) one
    LEFT JOIN LATERAL (
      SELECT -c.priority AS p, c.claim_run_at AS r, c.id AS i, c.claim_snapshot AS s, c.started_at AS t
      FROM jobs c WHERE c.queue = q AND c.claim_seq IS NOT NULL AND c.started_at IS NOT NULL
      ORDER BY c.claim_seq DESC LIMIT 1
    ) l ON asked IS NULL AND l.s IS NOT NULL
       AND NOT EXISTS (SELECT FROM jobs k WHERE k.queue = q AND k.status = 'pending' AND k.key IS NOT NULL)
  )
  SELECT u.id, u.priority, u.run_at FROM cursor, LATERAL (
    (SELECT j.id, j.priority, j.run_at FROM jobs j  -- on from there
     WHERE j.queue = q AND j.status = 'pending' AND j.run_at <= now()
       AND (-j.priority, j.run_at, j.id) > (cursor.p, cursor.r, cursor.i)
       AND coalesce(j.id = asked, true)
       AND (j.key IS NULL OR jobs_key_turn(q, j.key, j.priority, j.run_at, j.id))
     ORDER BY -j.priority, j.run_at, j.id LIMIT n)
    UNION ALL
    -- Before it (the newest claim's own job too: it may be pending again, a
    -- retry or a rescue), in three parts that share no row:
    (SELECT k.id, k.priority, k.run_at  -- not due at that claim
     FROM (SELECT k.id, k.priority, k.run_at FROM jobs k
           WHERE cursor.s IS NOT NULL AND k.queue = q AND k.status = 'pending'
             AND k.run_at > cursor.t AND k.run_at <= now()
           ORDER BY k.run_at OFFSET 0) k  -- jobs_pending_due: the one index in that order
     WHERE (-k.priority, k.run_at, k.id) <= (cursor.p, cursor.r, cursor.i))
    UNION ALL
    (SELECT k.id, k.priority, k.run_at  -- made pending since its snapshot
     FROM (SELECT k.id, k.priority, k.run_at FROM jobs k
           WHERE cursor.s IS NOT NULL AND k.queue = q AND k.status = 'pending'
             AND k.pending_xid >= pg_snapshot_xmax(cursor.s)
           OFFSET 0) k  -- read through jobs_pending_xid, never jobs_claim's dead prefix
     WHERE k.run_at <= cursor.t AND (-k.priority, k.run_at, k.id) <= (cursor.p, cursor.r, cursor.i))
    UNION ALL
    (SELECT k.id, k.priority, k.run_at FROM pg_snapshot_xip(cursor.s) x(xid)  -- by its transactions in flight
     JOIN LATERAL (SELECT k.id, k.priority, k.run_at FROM jobs k
                   WHERE k.queue = q AND k.status = 'pending' AND k.pending_xid = x.xid OFFSET 0) k
       ON k.run_at <= cursor.t AND (-k.priority, k.run_at, k.id) <= (cursor.p, cursor.r, cursor.i))
  ) u
  ORDER BY -u.priority, u.run_at, u.id
  LIMIT n
$$;

-- A row made pending (a retry, a rescue, a job given back, one redriven by
-- hand), or moved in its queue's order while pending, is noted with the
-- transaction that did it, as an inserted row is by pending_xid's default:
-- jobs_due reads such rows apart when they sort before the queue's newest claim.
CREATE OR REPLACE FUNCTION jobs_made_pending() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  NEW.pending_xid := pg_current_xact_id();
  RETURN NEW;
END $$;

-- With nothing due, the seconds until the queue's next pending row is due
-- (NULL when it has none).
CREATE OR REPLACE FUNCTION jobs_next_due_wait(q text) RETURNS TABLE (wait float8)
LANGUAGE sql STABLE AS $$
  SELECT extract(EPOCH FROM min(j.run_at) - now())::float8 FROM jobs j
  WHERE j.queue = q AND j.status = 'pending' AND j.run_at > now()
$$;

-- An outcome's error added to the attempts' errors ({attempt, at, worker,
-- error, traceback}, oldest first), when the outcome has one and is the
-- attempt's first (a resent outcome is not added twice).
CREATE OR REPLACE FUNCTION jobs_attempt_errors(
  errors jsonb, row_status text, attempt int, worker text, error text, traceback text
) RETURNS jsonb
LANGUAGE sql STABLE AS $$
  SELECT CASE WHEN error IS NULL OR row_status <> 'started' THEN errors
              ELSE coalesce(errors, '[]'::jsonb) || jsonb_build_array(jsonb_build_object(
                     'attempt', attempt, 'at', now(), 'worker', worker, 'error', error, 'traceback', traceback))
         END
$$;
