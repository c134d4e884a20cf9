-- State of a queue shared by every worker process: a pause (by a person, or
-- after an API rejected the token) and the earliest moment its next job may
-- be claimed (the throttle's delay, held for the queue, not one process).
CREATE TABLE IF NOT EXISTS job_queues (
  queue text PRIMARY KEY,
  paused_until timestamptz,
  pause_reason text,
  next_claim_at timestamptz
);

-- An idle poller asks when its queue's next delayed or retried row falls due,
-- to sleep exactly that long.
CREATE INDEX IF NOT EXISTS jobs_pending_due ON jobs (queue, run_at) WHERE status = 'pending';
