-- Named queries of the Django tasks backend (lib/adapters/django_tasks.py), run on the application's own connection.

-- name: job_task_result
-- One job as a Django task result, with the value its task returned (the step named step); jsonb as text, since Django's two drivers decode it differently.
SELECT j.id, j.name, j.args::text, j.status, j.created_at, j.started_at, j.finished_at, j.attempts,
       j.worker_id, j.attempt_errors::text, j.last_error, j.last_traceback, s.result::text
FROM jobs j
LEFT JOIN job_steps s ON s.job_id = j.id AND s.name = %(step)s
WHERE j.id = %(id)s
