-- migrate: in steps
-- What the queues page and /metrics count of each queue's pending rows (all,
-- due, retrying, the oldest due) read from one index: jobs_pending_due now
-- carries attempts, so the counts are an index-only scan of the pending rows
-- and read the table only for pages changed since the last vacuum
-- (docs/performance.md). Built under a new name, then swapped in, so the old
-- one serves until the new one is whole.
--
-- In steps: the indexes on jobs are built and dropped CONCURRENTLY, so
-- writers go on while they read the table.

-- step: the pending counts' index, under a new name
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_pending_due_counts
  ON jobs (queue, run_at) INCLUDE (attempts) WHERE status = 'pending';

-- step: the old one gone
DROP INDEX CONCURRENTLY IF EXISTS jobs_pending_due;

-- step: the new one under the old name
ALTER INDEX jobs_pending_due_counts RENAME TO jobs_pending_due;

-- step: the rolled-up minutes by time
-- The queues page's last hour of every queue's rolled-up minutes: a range of
-- this key, not a read of every minute the rollup keeps. job_minutes is the
-- workers' own table, written once a minute.
CREATE INDEX IF NOT EXISTS job_minutes_minute ON job_minutes (minute);

-- step: the jobs list's time window
-- Read through the block ranges that hold it: rows are written in
-- created_at order, so each range of pages spans a short time. minmax-multi
-- keeps a range narrow despite a few rows of another time in it (a
-- scheduled job's, a retried job's), where plain minmax would widen it to
-- span both. Small (a few hundred kB at 10M rows) and cheap to keep.
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_created ON jobs USING brin (created_at timestamptz_minmax_multi_ops);
