-- Named queries on cache_entries.

-- name: cache_delete_expired
-- Delete one batch of expired cache entries; short, so it never holds a long lock.
DELETE FROM cache_entries
WHERE key IN (SELECT key FROM cache_entries WHERE expires_at < now() LIMIT %(batch)s)
