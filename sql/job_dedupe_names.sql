-- Named queries on job_dedupe_names: which job names refuse a duplicate.

-- name: dedupe_declare
-- Make a queue's opted-in names exactly the given set (the worker declares them at start).
WITH gone AS (
  DELETE FROM job_dedupe_names WHERE queue = %(queue)s AND NOT (name = ANY(%(names)s::text[]))
)
INSERT INTO job_dedupe_names (queue, name)
SELECT %(queue)s, unnest(%(names)s::text[])
ON CONFLICT DO NOTHING
