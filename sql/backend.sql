-- Named queries on the server's own processes (lib/store/db.py).

-- name: backend_end
-- End a server process that ran a statement whose outcome is unknown, and wait until it is gone (no row: it was gone already); false means it still runs.
SELECT pg_terminate_backend(pid, %(timeout_ms)s::bigint) FROM pg_stat_activity WHERE pid = %(pid)s::int
