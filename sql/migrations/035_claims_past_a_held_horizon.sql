-- migrate: in steps
-- What a claim needs so that its cost does not grow with the jobs finished
-- since the oldest snapshot still open (a report's REPEATABLE READ, a
-- forgotten BEGIN, a standby's hot_standby_feedback): while that snapshot is
-- held, every row version a job leaves behind stays, and each index whose
-- range a claim reads from its start steps over them all.
--
-- claim_seq orders claims (a sequence: monotonic whatever the clocks) and
-- claim_slot keeps the slot of the claim after the outcome frees it: a
-- slot's holder, if any, is its newest claim (jobs_slot_holder). The claim's
-- snapshot and the row's run_at as claimed say where the queue's order
-- stood, so the next claim reads on from there (sql/rules/rules.sql,
-- jobs_due) instead of from the queue's first, long-dead, head. pending_xid
-- is the transaction that last made the row pending (or moved it in the
-- order): a row the last claim's snapshot could not see is read apart.
--
-- In steps: the indexes on jobs are built and dropped CONCURRENTLY, so
-- writers go on while they read the table; each new index is whole before
-- the one it replaces goes.

-- step: the columns, and the claims' sequence
ALTER TABLE jobs
  ADD COLUMN IF NOT EXISTS claim_seq bigint,
  ADD COLUMN IF NOT EXISTS claim_slot int,
  ADD COLUMN IF NOT EXISTS claim_snapshot pg_snapshot,
  ADD COLUMN IF NOT EXISTS claim_run_at timestamptz,
  ADD COLUMN IF NOT EXISTS pending_xid xid8;
-- New rows only: a volatile default on ADD COLUMN would rewrite the table.
ALTER TABLE jobs ALTER COLUMN pending_xid SET DEFAULT pg_current_xact_id();
CREATE SEQUENCE IF NOT EXISTS jobs_claim_seq;
-- A started row from before has no claim_seq: numbered so that its slot's
-- newest claim is itself (one a running job: a few rows).
UPDATE jobs SET claim_seq = nextval('jobs_claim_seq'), claim_slot = slot WHERE status = 'started' AND claim_seq IS NULL;

-- step: each queue's newest claims, read newest first
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_claims ON jobs (queue, claim_seq DESC) WHERE claim_seq IS NOT NULL;

-- step: each slot's newest claims, read newest first
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_slot_claims ON jobs (queue, claim_slot, claim_seq DESC)
  WHERE claim_seq IS NOT NULL;

-- step: the rows made pending since a snapshot, by queue
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_pending_xid ON jobs (queue, pending_xid) WHERE status = 'pending';

-- step: the started rows, for the rescue and the counts
-- Not unique, unlike jobs_started_slot, which it replaces: a unique index
-- checks each new started row against every dead version of its key, which
-- a held snapshot keeps; claims hold a queue to its concurrency under the
-- queue's turn (jobs_queue_turn, jobs_slot_holder).
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_started ON jobs (queue, slot) WHERE status = 'started';

-- step: jobs_started_slot gone
DROP INDEX CONCURRENTLY IF EXISTS jobs_started_slot;

-- step: a queue's order with its priority as its negation, under a new name
-- So that where a claim stands in it is one row to compare with (jobs_due).
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_queue_order ON jobs (queue, (-priority), run_at, id)
  WHERE status = 'pending';

-- step: the old order gone
DROP INDEX CONCURRENTLY IF EXISTS jobs_claim;

-- step: the new order under the old name
ALTER INDEX jobs_queue_order RENAME TO jobs_claim;
