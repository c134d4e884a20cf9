-- What ended each minute, per queue: the jobs finished by kind, the start
-- latency of those that ran (p50, p95) and the backlog due at the minute's
-- end. One worker writes each minute from the rows themselves
-- (lib/background/rollup.py), so a chart of the last day reads at most 1,440
-- rows of this table, never the jobs table. Queue '' is every queue together
-- (no queue is named ''), since percentiles do not add up across queues.
CREATE TABLE job_minutes (
  queue text NOT NULL,
  minute timestamptz NOT NULL,
  ok int NOT NULL DEFAULT 0,
  fail int NOT NULL DEFAULT 0,
  skip int NOT NULL DEFAULT 0,
  err int NOT NULL DEFAULT 0,
  latency_p50 float8,
  latency_p95 float8,
  backlog int,
  PRIMARY KEY (queue, minute)
);
