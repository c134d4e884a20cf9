-- Named queries of the API queues (lib/run/api_queue.py), loaded once by lib/store/sql.py.

-- name: job_last_error
-- The status a job last came back with: how many transient faults or rate limits in a row it has met.
SELECT last_error FROM jobs WHERE id = %(id)s::bigint
