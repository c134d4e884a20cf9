-- One row per scheduled job per UTC minute the clock enqueued it (or found a
-- copy still pending), written by the same statement as the job. Every worker
-- process runs a clock; the primary key lets only one of them act on a given
-- minute. The clock reads the latest row of a job back to catch up after
-- downtime, and deletes rows older than a few days, so the table stays small
-- (entries x minutes kept) and needs no index beyond its key.
CREATE TABLE IF NOT EXISTS clock_ticks (
  name text NOT NULL,
  minute timestamptz NOT NULL,
  PRIMARY KEY (name, minute)
);
