-- migrate: in steps
-- State of a queue shared by every worker process: a pause (by a person, or
-- after an API rejected the token) and the earliest moment its next job may
-- be claimed (the throttle's delay, held for the queue, not one process).
--
-- In steps: the index on jobs is built CONCURRENTLY, so writers go on while
-- it reads the table.

-- step: each queue's shared state
CREATE TABLE IF NOT EXISTS job_queues (
  queue text PRIMARY KEY,
  paused_until timestamptz,
  pause_reason text,
  next_claim_at timestamptz
);

-- step: when a queue's next delayed or retried row falls due
-- An idle poller asks, to sleep exactly that long.
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_pending_due ON jobs (queue, run_at) WHERE status = 'pending';
