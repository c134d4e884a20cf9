-- Jobs that wait for others (insert(..., after=[...]), sql/rules/waits.sql).
-- A job some other waits for is marked, so that its end alone runs the
-- trigger that tells the workers (jobs_dep_ended): nullable and without a
-- default, the table is not rewritten, and its lock is held for an instant.
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS waited_on boolean;

-- A waiting job: how many of the jobs it waits for have not ended, when it is
-- due once they have (its row's run_at is the end of time meanwhile), and
-- whether it runs whatever they end in. No foreign keys to jobs: their
-- triggers would run on every update of a job row.
CREATE TABLE IF NOT EXISTS job_waiters (
  waiter bigint PRIMARY KEY,
  waits int NOT NULL,
  run_at timestamptz NOT NULL,
  any_outcome boolean NOT NULL
);

-- Each job a waiting job waits for and has not seen end.
CREATE TABLE IF NOT EXISTS job_waits (
  dep bigint NOT NULL,
  waiter bigint NOT NULL,
  PRIMARY KEY (dep, waiter)
);
CREATE INDEX IF NOT EXISTS job_waits_waiter ON job_waits (waiter);
