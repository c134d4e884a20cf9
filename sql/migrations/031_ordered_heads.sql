-- jobs_due (026) reads a queue's head in the queue's order, whatever the
-- table's statistics say.
--
-- Its test of the asked id, j.id = coalesce(asked, j.id), was estimated as
-- an equality on the key: one row a queue. Reading one row, the planner saw
-- no gain in reading the queue in order and stopping at n, and with short
-- queues chose to read each queue's whole due set and sort it (a bitmap
-- scan of jobs_pending_due), for every claim. coalesce(j.id = asked, true)
-- says the same, and is estimated as half the rows: the ordered read of
-- jobs_claim, which stops at the n rows asked for, is then the cheaper plan.
CREATE OR REPLACE FUNCTION jobs_due(q text, asked bigint, n int) RETURNS TABLE (id bigint, priority int, run_at timestamptz)
LANGUAGE sql STABLE AS $$
  SELECT j.id, j.priority, j.run_at FROM jobs j
  WHERE j.queue = q AND j.status = 'pending' AND j.run_at <= now()
    AND coalesce(j.id = asked, true)
    AND (j.key IS NULL OR jobs_key_turn(q, j.key, j.priority, j.run_at, j.id))
  ORDER BY j.priority DESC, j.run_at, j.id
  LIMIT n
$$;
