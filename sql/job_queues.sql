-- Named queries on job_queues: the state of a queue shared by every process.

-- name: queue_pause
-- Pause a queue for every worker, until a moment or (NULL) until resumed; the workers are told on channel jobs_state (lib/operate/queue_state.py), so their logs show it. The reason is cut there: a notification holds at most 8000 bytes.
WITH paused AS (
  INSERT INTO job_queues (queue, paused_until, pause_reason)
  VALUES (%(queue)s, coalesce(%(until)s::timestamptz, 'infinity'), %(reason)s)
  ON CONFLICT (queue) DO UPDATE
  SET paused_until = excluded.paused_until, pause_reason = excluded.pause_reason
  RETURNING queue, paused_until, pause_reason
)
SELECT pg_notify('jobs_state', json_build_object(
         'queue', queue, 'event', 'paused', 'until', paused_until, 'reason', left(pause_reason, 500))::text)
FROM paused

-- name: queue_resume
-- End a queue's pause (with a reason prefix, only a pause whose reason starts so); one row per pause ended. In the same statement, so it lands at the commit: wake the queue's pollers on channel jobs (a paused poller sleeps to its fallback poll) and tell the workers on jobs_state.
WITH resumed AS (
  UPDATE job_queues SET paused_until = NULL, pause_reason = NULL
  WHERE queue = %(queue)s AND paused_until IS NOT NULL
    AND (%(prefix)s::text IS NULL OR starts_with(pause_reason, %(prefix)s))
  RETURNING queue
)
SELECT pg_notify('jobs', queue), pg_notify('jobs_state', json_build_object('queue', queue, 'event', 'resumed')::text)
FROM resumed

-- name: queue_paused
-- Queues paused now, with why and until when.
SELECT queue, pause_reason, paused_until FROM job_queues
WHERE paused_until > now() ORDER BY queue

-- name: queue_pause_once
-- Pause a queue unless it is paused already; a row back means this call paused it.
INSERT INTO job_queues (queue, paused_until, pause_reason)
VALUES (%(queue)s, %(until)s, %(reason)s)
ON CONFLICT (queue) DO UPDATE
SET paused_until = excluded.paused_until, pause_reason = excluded.pause_reason
WHERE job_queues.paused_until IS NULL OR job_queues.paused_until <= now()
RETURNING queue

-- name: rate_declare
-- A queue's rate or one of its budgets, as its definition says at a worker's start (migrations 025, 028): the row's spacing, burst, what a claim reserves (cost) and its group, kept moment (tat) and all. A row another transaction holds waits for the transaction's lock_timeout.
INSERT INTO job_rates (key, spacing, burst, cost, grp) VALUES (%(key)s, %(spacing)s, %(burst)s, %(cost)s, %(grp)s)
ON CONFLICT (key) DO UPDATE SET spacing = excluded.spacing, burst = excluded.burst, cost = excluded.cost, grp = excluded.grp
WHERE (job_rates.spacing, job_rates.burst, job_rates.cost, job_rates.grp)
  IS DISTINCT FROM (excluded.spacing, excluded.burst, excluded.cost, excluded.grp)

-- name: rate_drop_others
-- The group's limits the definition no longer has: gone, so they stop holding its claims.
DELETE FROM job_rates WHERE coalesce(grp, key) = %(grp)s AND NOT (key = ANY(%(keys)s::text[]))

-- name: budget_spend
-- What a job spent of one budget: its claim's reservation settled (the difference; negative gives back what it did not use), or, once settled, more spent (taken as a claim takes). No row waits longer than the transaction's lock_timeout.
UPDATE job_rates
SET tat = CASE WHEN %(settled)s::boolean THEN greatest(tat, now()) ELSE tat END + make_interval(secs => spacing * %(units)s::float8)
WHERE key = %(key)s

-- name: rate_name
-- Name a queue's rate key (NULL: no rate), after rate_declare has written the key's row.
INSERT INTO job_queues (queue, rate_key) VALUES (%(queue)s, %(key)s)
ON CONFLICT (queue) DO UPDATE SET rate_key = excluded.rate_key
WHERE job_queues.rate_key IS DISTINCT FROM excluded.rate_key

-- name: rate_clear
-- Of the queues given (none with a rate in this release), clear each that still names a rate; a row without one is not locked.
UPDATE job_queues SET rate_key = NULL WHERE queue = ANY(%(queues)s::text[]) AND rate_key IS NOT NULL

-- name: queue_scale
-- Set a queue's concurrency for every process (NULL: back to the definition's own), with who set it. At the commit its pollers are woken on channel jobs, so a slot let in claims at once, and the workers told on jobs_state.
WITH scaled AS (
  INSERT INTO job_queues (queue, scaled_to, scaled_by, scaled_at)
  VALUES (%(queue)s, %(to)s, %(by)s, now())
  ON CONFLICT (queue) DO UPDATE
  SET scaled_to = excluded.scaled_to, scaled_by = excluded.scaled_by, scaled_at = excluded.scaled_at
  RETURNING queue, scaled_to, scaled_by
)
SELECT pg_notify('jobs', queue), pg_notify('jobs_state', json_build_object(
         'queue', queue, 'event', 'scaled', 'to', scaled_to, 'by', left(scaled_by, 200))::text)
FROM scaled

-- name: budget_left
-- What the API says is left of one budget's limit now: the budget holds at least the rest as spent (its moment at least that far ahead), across every process.
UPDATE job_rates
SET tat = greatest(tat, now() + make_interval(secs => spacing * (burst - %(left)s::float8)))
WHERE key = %(key)s AND tat < now() + make_interval(secs => spacing * (burst - %(left)s::float8))
