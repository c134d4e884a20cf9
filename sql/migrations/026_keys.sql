-- migrate: in steps
-- Order per key (lib/insert.py's key=): the jobs of one key in one queue
-- start one at a time, in the queue's order, across every process; jobs of
-- different keys run at once up to the queue's concurrency, and a job with no
-- key is claimed as before. "One job at a time per repository, many
-- repositories at once". The rules in force: jobs_key_turn and jobs_due in
-- sql/rules/rules.sql, the inserts in sql/rules/insert.sql.
--
-- In steps: the column is added without a default (no row is written), and
-- the indexes are built CONCURRENTLY, so writers go on while they read the table.

-- step: each row's key
ALTER TABLE jobs ADD COLUMN key text;

-- step: one started job per queue and key
-- The database's own guard. The claim never meets it (it picks no job whose
-- key is started, under the queue's turn); a writer by hand would.
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS jobs_key_started
  ON jobs (queue, key) WHERE status = 'started' AND key IS NOT NULL;

-- step: a key's started or earlier due job
-- A claim's look for one, in the claim's order.
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_key_pending ON jobs (queue, key, priority DESC, run_at, id)
  WHERE status = 'pending' AND key IS NOT NULL;
