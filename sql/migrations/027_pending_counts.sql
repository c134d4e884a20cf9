-- What the queues page and /metrics count of each queue's pending rows (all,
-- due, retrying, the oldest due) read from one index: jobs_pending_due now
-- carries attempts, so the counts are an index-only scan of the pending rows
-- and read the table only for pages changed since the last vacuum
-- (docs/performance.md). Built under a new name, then swapped in, so the old
-- one serves until the new one is whole. Like 016, not CONCURRENTLY: the
-- build reads the whole table (0.8 s at 10M rows) and holds writes to jobs
-- meanwhile; 016's note says how to build such an index by hand first.
CREATE INDEX IF NOT EXISTS jobs_pending_due_counts
  ON jobs (queue, run_at) INCLUDE (attempts) WHERE status = 'pending';
DROP INDEX IF EXISTS jobs_pending_due;
ALTER INDEX jobs_pending_due_counts RENAME TO jobs_pending_due;

-- The queues page's last hour of every queue's rolled-up minutes: a range of
-- this key, not a read of every minute the rollup keeps.
CREATE INDEX IF NOT EXISTS job_minutes_minute ON job_minutes (minute);

-- The jobs list's time window (created_at), read through the block ranges
-- that hold it: rows are written in created_at order, so each range of
-- pages spans a short time. minmax-multi keeps a range narrow despite a few
-- rows of another time in it (a scheduled job's, a retried job's), where
-- plain minmax would widen it to span both. Small (a few hundred kB at 10M
-- rows) and cheap to keep; its build reads the table (7 s at 10M rows).
CREATE INDEX IF NOT EXISTS jobs_created ON jobs USING brin (created_at timestamptz_minmax_multi_ops);
