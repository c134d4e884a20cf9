-- jobs_step_one: jobs_step (014) for a batch of one ask, an outcome and/or
-- one slot's claim, each field a plain value. It is what an idle or serial
-- worker sends on every job (lib/commit.py sends jobs_step only when asks
-- of several slots are ready together), so it is written for that one case:
-- jobs_step's claim statement, built to serve any number of queues and
-- slots at once, initialises some forty plan nodes on every call and took
-- 0.35 ms of server CPU a step; this takes 0.24 ms for the same work
-- (bench/step_cost.py).
--
-- The rules are jobs_step's, and tests/test_step_one.py holds the two to
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
BEGIN
  IF o_id IS NOT NULL THEN
    IF o_delay > 0 THEN
      PERFORM pg_advisory_xact_lock(1785684595, hashtext(j.queue)) FROM jobs j WHERE j.id = o_id;  -- jobs_queue_turn
    END IF;
    RETURN QUERY
    WITH done AS (
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
      RETURNING j.id, j.queue
    ),
    gated AS (
      INSERT INTO job_queues (queue, next_claim_at)
      SELECT done.queue, now() + make_interval(secs => o_delay) FROM done
      WHERE o_delay > 0
      ON CONFLICT (queue) DO UPDATE SET next_claim_at = excluded.next_claim_at
    )
    SELECT NULL::text, NULL::text, done.id, NULL::text, NULL::text, NULL::int, NULL::int, NULL::text,
           NULL::float8, NULL::float8, NULL::int
    FROM done;
  END IF;
  IF c_queue IS NULL THEN
    RETURN;
  END IF;
  IF NOT pg_try_advisory_xact_lock(1785684595, hashtext(c_queue)) THEN  -- jobs_queue_turn
    RETURN QUERY SELECT c_queue, c_worker, NULL::bigint, NULL::text, NULL::text, NULL::int, NULL::int, NULL::text,
                        NULL::float8, 0.05::float8, NULL::int;
    RETURN;
  END IF;
  -- A statement after the lock: its snapshot holds what committed before it.
  RETURN QUERY
  WITH gate AS (
    SELECT greatest(jq.paused_until, jq.next_claim_at) AS until FROM job_queues jq
    WHERE jq.queue = c_queue AND greatest(jq.paused_until, jq.next_claim_at) > now()
  ),
  free AS (
    SELECT WHERE NOT EXISTS (SELECT 1 FROM jobs s WHERE s.queue = c_queue AND s.status = 'started' AND s.slot = c_slot)
  ),
  head AS (
    SELECT j.id FROM jobs j
    WHERE j.queue = c_queue AND j.status = 'pending' AND j.run_at <= now()
      AND j.id = coalesce(c_id, j.id)  -- not an OR: that makes the generic plan look dear
      AND NOT EXISTS (SELECT FROM gate) AND EXISTS (SELECT FROM free)
    ORDER BY j.priority DESC, j.run_at, j.id
    LIMIT 1
  ),
  picked AS (
    SELECT j.id FROM jobs j
    WHERE j.id = (SELECT head.id FROM head) AND j.status = 'pending'
    FOR UPDATE SKIP LOCKED
  ),
  claimed AS (
    UPDATE jobs j
    SET status = 'started', started_at = now(), finished_at = NULL,
        attempts = j.attempts + 1,
        max_attempts = coalesce(j.max_attempts, c_max_attempts),
        worker_id = c_worker, slot = c_slot,
        lease_until = clock_timestamp() + make_interval(secs => c_lease)
    FROM picked p
    WHERE j.id = p.id
    RETURNING c_queue, c_worker, j.id, j.name, j.args::text, j.attempts, j.max_attempts, j.callsite,
              greatest(extract(EPOCH FROM now() - j.run_at), 0)::float8, NULL::float8, c_slot
  )
  SELECT * FROM claimed
  UNION ALL
  SELECT c_queue, c_worker, NULL::bigint, NULL::text, NULL::text, NULL::int, NULL::int, NULL::text, NULL::float8,
         CASE
           WHEN EXISTS (SELECT FROM gate)  -- a pause may be infinite
             THEN extract(EPOCH FROM least((SELECT gate.until FROM gate), now() + interval '1 day') - now())::float8
           WHEN NOT EXISTS (SELECT FROM free) THEN NULL::float8  -- the slot is taken
           WHEN EXISTS (SELECT FROM head) THEN 0.05::float8  -- its head is held
           ELSE extract(EPOCH FROM (SELECT min(j.run_at) FROM jobs j
                                    WHERE j.queue = c_queue AND j.status = 'pending' AND j.run_at > now()) - now())::float8
         END,
         NULL::int
  WHERE NOT EXISTS (SELECT FROM claimed);
END
$$;
