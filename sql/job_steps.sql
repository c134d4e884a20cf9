-- Named queries of jobs' steps (PendingJob.step, lib/run/job_steps.py): the result of each step a job has run, kept for its later runs.

-- name: job_steps_read
-- Every step a job has stored, name and result: read once a run, at its first step.
SELECT name, result FROM job_steps WHERE job_id = %(id)s

-- name: job_step_keep
-- Store a step's result unless a run of the job stored one first; the result as the row holds it, no row when another run's was there.
INSERT INTO job_steps (job_id, name, result) VALUES (%(id)s, %(name)s, %(result)s::jsonb)
ON CONFLICT (job_id, name) DO NOTHING
RETURNING result

-- name: job_step_get
-- One step's stored result: the one another run stored when job_step_keep found it there.
SELECT result FROM job_steps WHERE job_id = %(id)s AND name = %(name)s

-- name: job_steps_listed
-- A job's steps for a person (show, the admin page), the first stored first, at most limit; total: how many it has.
SELECT name, stored_at, result, count(*) OVER () AS total
FROM job_steps WHERE job_id = %(id)s
ORDER BY stored_at, name
LIMIT %(limit)s
