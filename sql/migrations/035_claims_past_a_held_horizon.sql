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
ALTER TABLE jobs
  ADD COLUMN claim_seq bigint,
  ADD COLUMN claim_slot int,
  ADD COLUMN claim_snapshot pg_snapshot,
  ADD COLUMN claim_run_at timestamptz,
  ADD COLUMN pending_xid xid8;
-- New rows only: a volatile default on ADD COLUMN would rewrite the table.
ALTER TABLE jobs ALTER COLUMN pending_xid SET DEFAULT pg_current_xact_id();
CREATE SEQUENCE IF NOT EXISTS jobs_claim_seq;
-- A started row from before has no claim_seq: numbered so that its slot's
-- newest claim is itself.
UPDATE jobs SET claim_seq = nextval('jobs_claim_seq'), claim_slot = slot WHERE status = 'started' AND claim_seq IS NULL;

-- Each queue's and each slot's newest claims, read newest first: one entry
-- reached whatever the dead versions behind it.
CREATE INDEX IF NOT EXISTS jobs_claims ON jobs (queue, claim_seq DESC) WHERE claim_seq IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_slot_claims ON jobs (queue, claim_slot, claim_seq DESC) WHERE claim_seq IS NOT NULL;
-- A queue's order with its priority as its negation, so that where a claim
-- stands in it is one row to compare with (jobs_due).
CREATE INDEX IF NOT EXISTS jobs_queue_order ON jobs (queue, (-priority), run_at, id) WHERE status = 'pending';
DROP INDEX IF EXISTS jobs_claim;
ALTER INDEX jobs_queue_order RENAME TO jobs_claim;
-- The rows made pending since a snapshot, by queue.
CREATE INDEX IF NOT EXISTS jobs_pending_xid ON jobs (queue, pending_xid) WHERE status = 'pending';
-- The started rows, for the rescue and the counts. Not unique: a unique
-- index checks each new started row against every dead version of its key,
-- which a held snapshot keeps; claims hold a queue to its concurrency under
-- the queue's turn (jobs_queue_turn, jobs_slot_holder).
CREATE INDEX IF NOT EXISTS jobs_started ON jobs (queue, slot) WHERE status = 'started';
DROP INDEX IF EXISTS jobs_started_slot;
