-- Named queries of the admin page (lib/http/admin) on the jobs table.
--
-- The jobs list and its counts take every filter as a parameter that may be
-- NULL, and are planned for their values ("-- plan: custom"): the server then
-- folds away each filter left NULL and each state not asked for, and what is
-- left is the bare predicate a partial index was built for (status =
-- 'pending', 'started', starts_with(status, 'err: '), status NOT IN
-- ('pending', 'started')) or `args @> <jsonb>` that jobs_args (migration 023)
-- serves. A generic plan would keep the ORs and could use none of them.

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

-- name: admin_job_list
-- One page of the jobs list, newest (highest id) first, below the cursor id before; filtered by state, queue, exact name, name prefix, args containment (served by jobs_args) and created_at range; each row with what its state is read from (lib/http/admin/jobs.py's state_of).
-- plan: custom
SELECT id, queue, name, status, attempts, max_attempts, run_at, created_at, started_at, finished_at,
       last_error IS NOT NULL AS erred
FROM jobs
WHERE (%(before)s::bigint IS NULL OR id < %(before)s::bigint)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(name)s::text IS NULL OR name = %(name)s::text)
  AND (%(prefix)s::text IS NULL OR starts_with(name, %(prefix)s::text))
  AND (%(args)s::jsonb IS NULL OR args @> %(args)s::jsonb)
  AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s::timestamptz)
  AND (%(until)s::timestamptz IS NULL OR created_at < %(until)s::timestamptz)
  AND (%(state)s::text IS NULL
    OR (%(state)s::text = 'pending' AND status = 'pending')
    OR (%(state)s::text = 'scheduled' AND status = 'pending' AND run_at > now())
    OR (%(state)s::text = 'retrying' AND status = 'pending' AND attempts > 0 AND last_error IS NOT NULL)
    OR (%(state)s::text = 'running' AND status = 'started')
    OR (%(state)s::text IN ('failed', 'err') AND starts_with(status, 'err: '))
    OR (%(state)s::text = 'done' AND status NOT IN ('pending', 'started'))
    OR (%(state)s::text = 'ok' AND status NOT IN ('pending', 'started') AND (status = 'ok' OR starts_with(status, 'ok: ')))
    OR (%(state)s::text = 'fail' AND status NOT IN ('pending', 'started') AND starts_with(status, 'fail: '))
    OR (%(state)s::text = 'skip' AND status NOT IN ('pending', 'started') AND starts_with(status, 'skip: ')))
-- Newest first by the primary key, except under an args search or a
-- window of a day at most (by_created): there the planner, sure the key read
-- backwards meets a match soon, would read every row newer than the window
-- or every row to find a rare customer's few; "id + 0" has no index order,
-- so it reads the matches through jobs_args or jobs_created (migration 027)
-- and sorts those. Folded for the values.
ORDER BY CASE WHEN %(args)s::jsonb IS NULL AND NOT %(by_created)s::boolean THEN id ELSE id + 0 END DESC
LIMIT %(limit)s::int

-- name: admin_job_count
-- How many jobs one state of the jobs list holds under its other filters, counted up to cap rows and no further, so a count never reads millions of rows.
-- plan: custom
SELECT count(*)::int FROM (
  SELECT 1
  FROM jobs
  WHERE (%(queue)s::text IS NULL OR queue = %(queue)s::text)
    AND (%(name)s::text IS NULL OR name = %(name)s::text)
    AND (%(prefix)s::text IS NULL OR starts_with(name, %(prefix)s::text))
    AND (%(args)s::jsonb IS NULL OR args @> %(args)s::jsonb)
    AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s::timestamptz)
    AND (%(until)s::timestamptz IS NULL OR created_at < %(until)s::timestamptz)
    AND (%(state)s::text IS NULL
      OR (%(state)s::text = 'pending' AND status = 'pending')
      OR (%(state)s::text = 'scheduled' AND status = 'pending' AND run_at > now())
      OR (%(state)s::text = 'retrying' AND status = 'pending' AND attempts > 0 AND last_error IS NOT NULL)
      OR (%(state)s::text = 'running' AND status = 'started')
      OR (%(state)s::text IN ('failed', 'err') AND starts_with(status, 'err: '))
      OR (%(state)s::text = 'done' AND status NOT IN ('pending', 'started'))
      OR (%(state)s::text = 'ok' AND status NOT IN ('pending', 'started') AND (status = 'ok' OR starts_with(status, 'ok: ')))
      OR (%(state)s::text = 'fail' AND status NOT IN ('pending', 'started') AND starts_with(status, 'fail: '))
      OR (%(state)s::text = 'skip' AND status NOT IN ('pending', 'started') AND starts_with(status, 'skip: ')))
  LIMIT %(cap)s::int
) AS capped

-- name: admin_job_run_now
-- Make a scheduled job (pending, run_at in the future, not waiting for other jobs) due now and wake its queue's pollers, which may be asleep until the old run_at; the id when it was one.
WITH moved AS (
  UPDATE jobs SET run_at = now()
  WHERE id = %(id)s::bigint AND status = 'pending' AND run_at > now() AND run_at < jobs_waiting_run_at()
  RETURNING id, queue
)
SELECT id, pg_notify('jobs', queue) FROM moved

-- name: admin_queue_rates
-- Per queue given, and for every queue (''), the jobs finished in the minutes rolled up from a moment on and how many minutes those were: the queues page's rate, read through job_minutes' key.
SELECT q.queue, coalesce(sum(m.ok + m.fail + m.skip + m.err), 0)::int, count(*)::int
FROM unnest(array_append(%(queues)s::text[], '')) AS q(queue)
JOIN job_minutes m ON m.queue = q.queue AND m.minute >= %(since)s::timestamptz
GROUP BY q.queue

-- name: admin_queue_rate_limited
-- Of the given queues, each whose head job (the next the claim takes, read through jobs_claim) last came back rate limited by its API, with that status: the throttle holding the queue is the API's limit.
SELECT q.queue, h.last_error
FROM unnest(%(queues)s::text[]) AS q(queue)
CROSS JOIN LATERAL (
  SELECT last_error FROM jobs
  WHERE status = 'pending' AND queue = q.queue
  ORDER BY -priority, run_at, id
  LIMIT 1
) AS h
WHERE starts_with(h.last_error, 'skip: rate limited')

-- name: admin_clock_last_fired
-- For each schedule entry given (name and entry key, in two arrays of one order), the latest minute any clock fired it, as clock_last_fired reads it; one look-up in clock_ticks' key each.
SELECT e.name, e.entry,
       (SELECT max(t.minute) FROM clock_ticks t WHERE t.name = e.name AND t.entry IN (e.entry, ''))
FROM unnest(%(names)s::text[], %(entries)s::text[]) AS e(name, entry)

-- name: admin_worker_handles
-- The job names each of the given workers handles, per queue (a JSON object; empty for a release that writes none).
SELECT id, coalesce(handles, '{}'::jsonb) FROM workers WHERE id = ANY(%(ids)s::text[])
