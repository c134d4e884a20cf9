-- Named queries of the operator's commands (lib/operate/commands.py) on the jobs table.

-- name: job_failed
-- Failed (err:) rows newest first, by optional ids, queue, name and age in seconds, at most limit (NULL: all); read backwards through jobs_failed (jobs_failed_queue for a queue), so a limit stops early.
-- plan: custom
SELECT id, queue, name, attempts, finished_at, callsite, status
FROM jobs
WHERE status NOT IN ('pending', 'started') AND starts_with(status, 'err: ')
  AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(name)s::text IS NULL OR name = %(name)s::text)
  AND (%(since)s::float8 IS NULL OR finished_at > now() - make_interval(secs => %(since)s::float8))
ORDER BY finished_at DESC, id DESC
LIMIT %(limit)s::bigint

-- name: job_get
-- One job, every column, for a person who asked to see it (args included).
SELECT id, queue, name, status, args, priority, run_at, attempts, max_attempts, last_error, callsite,
       worker_id, slot, lease_until, dedupe, created_at, started_at, finished_at, last_traceback, attempt_errors, key,
       cancel_requested
FROM jobs WHERE id = %(id)s::bigint

-- name: job_cancel
-- End the given jobs that are still pending with the operator's status; the ids ended. A job claimed meanwhile is no longer pending and is left to run.
UPDATE jobs SET status = %(status)s, finished_at = now()
WHERE id = ANY(%(ids)s::bigint[]) AND status = 'pending'
RETURNING id

-- name: job_cancel_running
-- Ask the workers running the given started jobs to stop them (a second ask keeps the first asker), and tell every worker at commit: NOTIFY jobs_cancel, '<id> <who>' (lib/store/wakeups.py); the ids asked. A worker that misses the NOTIFY learns of it from its next lease renewal (job_heartbeat).
WITH asked AS (
  UPDATE jobs SET cancel_requested = coalesce(cancel_requested, %(by)s::text)
  WHERE id = ANY(%(ids)s::bigint[]) AND status = 'started'
  RETURNING id, cancel_requested
)
SELECT a.id FROM asked a CROSS JOIN LATERAL pg_notify('jobs_cancel', a.id || ' ' || a.cancel_requested) AS n

-- name: job_statuses
-- The status of each of the given jobs that exists.
SELECT id, status FROM jobs WHERE id = ANY(%(ids)s::bigint[])

-- name: job_status_of
-- The status of each of the given jobs that exists: why a redrive asked for by id left one alone.
SELECT id, status FROM jobs WHERE id = ANY(%(ids)s::bigint[])

-- name: job_failed_names
-- The queue and job name of every failed (err:) row, once each, read through jobs_failed: what failed and redrive can find besides the queues live workers run.
SELECT DISTINCT queue, name
FROM jobs
WHERE status NOT IN ('pending', 'started') AND starts_with(status, 'err: ')
