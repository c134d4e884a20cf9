-- migrate: in steps
-- jobs_pending_xid again, its predicate naming pending_xid (which every row
-- has): only a read that compares pending_xid may use it. A read of a
-- queue's pending rows by other columns could otherwise take it, matching
-- the queue alone, and step over every pending row of the queue and every
-- dead version a held snapshot keeps: the planner costs both indexes alike
-- when it believes the queue small (no statistics yet, or the held
-- snapshot's dead versions unseen by them).

-- step: the rows made pending since a snapshot, by queue, under a new name
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_pending_since ON jobs (queue, pending_xid)
  WHERE status = 'pending' AND pending_xid IS NOT NULL;

-- step: the old one gone
DROP INDEX CONCURRENTLY IF EXISTS jobs_pending_xid;

-- step: the new one under the old name
ALTER INDEX jobs_pending_since RENAME TO jobs_pending_xid;
