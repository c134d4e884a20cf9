-- migrate: in steps
-- The failed (err:) rows of one queue and name, oldest to newest: what the
-- failed list, redrive and the admin page read when the operator names a
-- queue (and a name). jobs_failed (012) holds every queue's failures in one
-- order, so such a filter would read all of them; this index reads only the
-- queue's (docs/performance.md). The queries
-- are planned for their values on every run ("-- plan: custom" in sql/), or
-- their "queue IS NULL OR ..." filters could not use it.
--
-- In steps: built CONCURRENTLY, so writers go on while it reads the table.

-- step: the failures by queue and name
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_failed_queue
  ON jobs (queue, name, finished_at) WHERE starts_with(status, 'err: ');
