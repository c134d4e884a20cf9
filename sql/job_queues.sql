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
