-- Named queries on workers: the registry of worker processes (lib/background/worker_registry.py, lib/operate/overview.py).

-- name: worker_seen
-- Note a worker as seen now: its row written at start, last_seen moved on at each refresh (written again if it was forgotten meanwhile).
INSERT INTO workers (id, host, pid, queues, started_at, last_seen, lease_seconds, handles)
VALUES (%(id)s, %(host)s, %(pid)s::int, %(queues)s::text[], %(started_at)s::timestamptz, now(), %(lease)s::float8,
        %(handles)s::jsonb)
ON CONFLICT (id) DO UPDATE SET last_seen = excluded.last_seen

-- name: worker_handles_elsewhere
-- Whether a worker seen within the given number of its own lease periods (alive, as worker_list reads it) handles the job name on the queue.
SELECT EXISTS (
  SELECT FROM workers w
  WHERE w.handles -> %(queue)s::text ? %(name)s::text
    AND w.last_seen > now() - make_interval(secs => %(periods)s::float8 * w.lease_seconds)
)

-- name: worker_remove
-- Take a worker that stopped cleanly out of the registry, unless a started row still names it.
DELETE FROM workers w
WHERE id = %(id)s AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.status = 'started' AND j.worker_id = w.id)

-- name: worker_forget
-- Delete the rows of workers unseen for the given days, except one still named by a started row: the registry is what names that dead holder.
DELETE FROM workers w
WHERE last_seen < now() - make_interval(days => %(days)s)
  AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.status = 'started' AND j.worker_id = w.id)

-- name: worker_list
-- Registered workers seen within a few of their own lease periods (alive), and the others still holding started rows, with the count each holds.
WITH holding AS (
  SELECT worker_id, count(*)::int AS n FROM jobs WHERE status = 'started' GROUP BY worker_id
)
SELECT w.id, w.host, w.pid, w.started_at, w.last_seen, w.queues,
       w.last_seen > coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(periods)s::float8 * w.lease_seconds) AS alive,
       coalesce(h.n, 0)
FROM workers w
LEFT JOIN holding h ON h.worker_id = w.id
WHERE h.n > 0
   OR w.last_seen > coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(periods)s::float8 * w.lease_seconds)
ORDER BY w.started_at, w.id

-- name: worker_live_handles
-- Each queue a live worker (seen within the given number of its own lease periods, as worker_list reads alive) runs, with the job names live workers handle in it: what the operator's commands know besides their own registry. A queue of a worker that writes no handles (a release before migration 019) comes with no names.
SELECT q.queue, coalesce(array_agg(DISTINCT n.name ORDER BY n.name) FILTER (WHERE n.name IS NOT NULL), '{}')
FROM workers w
CROSS JOIN LATERAL (SELECT unnest(w.queues) UNION SELECT jsonb_object_keys(w.handles)) AS q(queue)
LEFT JOIN LATERAL jsonb_array_elements_text(w.handles -> q.queue) AS n(name) ON true
WHERE w.last_seen > now() - make_interval(secs => %(periods)s::float8 * w.lease_seconds)
GROUP BY q.queue
ORDER BY q.queue
