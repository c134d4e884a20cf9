-- Named queries of the admin page (lib/http/admin) on the jobs table, read-only.

-- name: job_failed_list
-- The newest failed (err:) jobs, optionally of one queue and one name, read newest first through jobs_failed, or jobs_failed_queue for a queue (their predicate is this one), so the cost is bounded by the failures kept, not by every finished row.
-- plan: custom
SELECT id, queue, name, status, attempts, max_attempts, finished_at
FROM jobs
WHERE starts_with(status, 'err: ')
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(name)s::text IS NULL OR name = %(name)s)
ORDER BY finished_at DESC
LIMIT %(limit)s
