-- A small key/value cache that handlers use for results worth keeping a while
-- (an API answer, say); the caches queue deletes what expired.
CREATE TABLE IF NOT EXISTS cache_entries (
  key text PRIMARY KEY,
  value jsonb NOT NULL,
  expires_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS cache_entries_expires ON cache_entries (expires_at);
