-- migrate: in steps
-- The rescue reads the started rows through jobs_started_slot, which holds
-- every started row (one a running job), so jobs_started_lease goes.
--
-- lease_until was the only column of that index, and the only one a renewal
-- changes: with it gone a renewal updates its rows in place (HOT) and writes
-- no entry to any index, and a claim writes one index entry fewer.
--
-- In steps: dropped CONCURRENTLY, so no writer waits for the table's lock.

-- step: the lease index gone
DROP INDEX CONCURRENTLY IF EXISTS jobs_started_lease;
