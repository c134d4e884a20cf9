-- The worker registry: one row per worker start, so an operator sees every
-- process (on any host) and which of them still hold started rows. A worker
-- writes its row at start and refreshes last_seen from its lease keeper; the
-- maintenance queue forgets rows unseen for a day. lease_seconds is the
-- worker's own lease: it refreshes every third of it, so whether a row is
-- stale depends on the lease of the worker that wrote it, not of the reader.
CREATE TABLE IF NOT EXISTS workers (
  id text PRIMARY KEY,
  host text NOT NULL,
  pid int NOT NULL,
  queues text[] NOT NULL,
  started_at timestamptz NOT NULL,
  last_seen timestamptz NOT NULL,
  lease_seconds float8 NOT NULL
);
