-- A queue's rate, a queue's concurrency set at run time, and every
-- attempt's error: the tables and columns they need. The rules that read and
-- write them are in force in sql/rules/rates.sql, rules.sql and step.sql.

CREATE TABLE job_rates (
  key text PRIMARY KEY,
  spacing float8 NOT NULL CHECK (spacing > 0),
  burst int NOT NULL CHECK (burst >= 1),
  tat timestamptz NOT NULL DEFAULT '-infinity'
);

-- Declared at each worker's start with the queue's definition; NULL: no rate.
ALTER TABLE job_queues ADD COLUMN rate_key text REFERENCES job_rates (key);

-- A queue's concurrency set at run time (`worker.py scale`), for every
-- process: slots from scaled_to up claim nothing. NULL: the definition's own.
-- The definition's concurrency is the most a process runs, so the most it
-- can be set to; who set it and when, for `status`.
ALTER TABLE job_queues
  ADD COLUMN scaled_to int CHECK (scaled_to >= 1),
  ADD COLUMN scaled_by text,
  ADD COLUMN scaled_at timestamptz;

-- Each attempt's error, oldest first: {attempt, at, worker, error,
-- traceback}. Written with a failing outcome; last_error and last_traceback
-- stay the last one's, for the lists that read them.
ALTER TABLE jobs ADD COLUMN attempt_errors jsonb;

-- jobs_gate answers more columns (sql/rules/rules.sql): a function's result
-- type cannot be replaced in place.
DROP FUNCTION IF EXISTS jobs_gate(text);
