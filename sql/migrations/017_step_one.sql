-- jobs_step_one: jobs_step (014) for a batch of one ask, an outcome and/or
-- one slot's claim, each field a plain value. It is what an idle or serial
-- worker sends on every job (lib/store/group_commit.py sends jobs_step only when asks
-- of several slots are ready together), so it is written for that one case:
-- a few small statements, each run only when the one before leaves the
-- answer open, where jobs_step's claim statement, built to serve any number
-- of queues and slots at once, sets up some forty plan nodes on every call
-- (bench/step_cost.py measures both).
--
-- The rules are jobs_step's, and tests/db/test_step_one.py holds the two to
-- the same answers, case by case: an outcome matches the row while it is
-- still started by this claim, or already holds this very outcome; a
-- throttling outcome takes its queue's turn until it commits; a claim takes
-- the queue's turn without waiting (busy: "look again shortly", 0.05),
-- then reads the gate and the slot after it, and takes the queue's head
-- only: when another transaction holds the head row, it claims nothing
-- (0.05), never the row behind it.
--
-- A NULL o_id sends no outcome; a NULL c_queue, no claim.
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
BEGIN
  IF o_id IS NOT NULL THEN
    IF o_delay > 0 THEN
      PERFORM pg_advisory_xact_lock(1785684595, hashtext(j.queue)) FROM jobs j WHERE j.id = o_id;  -- jobs_queue_turn
    END IF;
    UPDATE jobs j
    SET status = o_status,
        finished_at = CASE WHEN o_retry_in IS NULL THEN now() END,
        run_at = CASE WHEN coalesce(o_retry_in, 0) = 0 THEN j.run_at
                      ELSE now() + make_interval(secs => o_retry_in) END,
        last_error = coalesce(o_last_error, j.last_error),
        last_traceback = CASE WHEN o_last_error IS NULL THEN j.last_traceback ELSE o_traceback END,
        max_attempts = j.max_attempts + o_uncounted,
        lease_until = NULL, slot = NULL
    WHERE j.id = o_id AND j.worker_id = o_worker AND j.attempts = o_attempts
      AND j.status IN ('started', o_status)
    RETURNING j.queue INTO done_queue;
    IF FOUND THEN
      IF o_delay > 0 THEN
        INSERT INTO job_queues (queue, next_claim_at) VALUES (done_queue, now() + make_interval(secs => o_delay))
        ON CONFLICT (queue) DO UPDATE SET next_claim_at = excluded.next_claim_at;
      END IF;
      id := o_id;  -- the outcome's row: its id alone
      RETURN NEXT;
      id := NULL;
    END IF;
  END IF;
  IF c_queue IS NULL THEN
    RETURN;
  END IF;
  -- The claim's row: its queue and worker, and the job claimed or the wait.
  queue := c_queue;
  worker_id := c_worker;
  IF NOT pg_try_advisory_xact_lock(1785684595, hashtext(c_queue)) THEN  -- jobs_queue_turn
    wait := 0.05;
    RETURN NEXT;
    RETURN;
  END IF;
  -- Statements after the lock: their snapshots hold what committed before it.
  SELECT greatest(jq.paused_until, jq.next_claim_at) INTO gate FROM job_queues jq WHERE jq.queue = c_queue;
  IF gate > now() THEN
    wait := extract(EPOCH FROM least(gate, now() + interval '1 day') - now());  -- a pause may be infinite
    RETURN NEXT;
    RETURN;
  END IF;
  IF EXISTS (SELECT FROM jobs s WHERE s.queue = c_queue AND s.status = 'started' AND s.slot = c_slot) THEN
    RETURN NEXT;  -- the slot is taken: no wait known
    RETURN;
  END IF;
  SELECT j.id INTO head FROM jobs j
  WHERE j.queue = c_queue AND j.status = 'pending' AND j.run_at <= now()
    AND j.id = coalesce(c_id, j.id)  -- not an OR: that makes the generic plan look dear
  ORDER BY j.priority DESC, j.run_at, j.id
  LIMIT 1;
  IF head IS NULL THEN
    wait := extract(EPOCH FROM (SELECT min(j.run_at) FROM jobs j
                                WHERE j.queue = c_queue AND j.status = 'pending' AND j.run_at > now()) - now());
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
