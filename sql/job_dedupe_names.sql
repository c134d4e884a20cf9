-- Named queries on job_dedupe_names: which job names refuse a duplicate.

-- name: dedupe_declare
-- Add a queue's dedupe names (never remove one: another process may list more) and dedupe the rows already waiting under the new ones; the names added and the copies ended as duplicates.
SELECT added, skipped FROM jobs_dedupe_declare(%(queue)s, %(names)s::text[])
