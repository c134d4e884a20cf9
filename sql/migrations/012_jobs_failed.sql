-- migrate: in steps
-- The failed (err:) rows, newest first, for the admin page's failures list:
-- without it, a list filtered to a queue with few failures reads every
-- finished row kept for retention. Partial, so it holds the failures only.
--
-- In steps: built CONCURRENTLY, so writers go on while it reads the table.

-- step: the failures by age
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_failed ON jobs (finished_at) WHERE starts_with(status, 'err: ');
