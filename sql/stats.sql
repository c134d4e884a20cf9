-- Read-only queries for the operator's views (lib/operate/overview.py): status, /metrics.
-- Each reads the jobs table only through a partial index (pending rows, started
-- rows, rows finished since a moment), so its cost does not grow with the
-- finished rows kept for retention.

-- name: queue_stats
-- Per queue: pending rows (due, retrying, oldest due run_at), started rows, rows finished in the last hour by status prefix (rolled-up minutes, then the rows since), the pause and throttle in force, the concurrency set at run time and by whom, the keys with work; for every queue with live or recent rows or job_queues state, and the names given.
WITH pending AS (
  SELECT queue,
         count(*)::int AS pending,
         count(*) FILTER (WHERE run_at <= now())::int AS due,
         count(*) FILTER (WHERE attempts > 0)::int AS retrying,
         min(run_at) FILTER (WHERE run_at <= now()) AS oldest_due
  FROM jobs WHERE status = 'pending'
  GROUP BY queue
),
running AS (
  SELECT queue, count(*)::int AS running FROM jobs WHERE status = 'started' GROUP BY queue
),
-- Keys with work, through jobs_key_pending and jobs_key_started (migration 026).
keyed AS (
  SELECT queue, count(DISTINCT key)::int AS keys
  FROM (SELECT queue, key FROM jobs WHERE status = 'pending' AND key IS NOT NULL
        UNION ALL
        SELECT queue, key FROM jobs WHERE status = 'started' AND key IS NOT NULL) AS working
  GROUP BY queue
),
-- Finished in the last hour, by status prefix: whole minutes from the rollup
-- (job_minutes, migration 024) up to the last one it wrote, and only the rows
-- finished since then from jobs, so a view reads a few minutes of finished
-- rows, not the hour's. With no rollup in the hour, every row is read.
rolled AS (
  SELECT greatest(max(minute) + interval '1 minute', date_trunc('minute', now() - interval '1 hour')) AS upto
  FROM job_minutes
  WHERE queue = '' AND minute >= date_trunc('minute', now() - interval '1 hour')
),
done AS (
  SELECT queue, jsonb_object_agg(prefix, n) AS done
  FROM (
    SELECT queue, prefix, sum(n)::int AS n
    FROM (
      SELECT m.queue, k.prefix, k.n
      FROM job_minutes m
      CROSS JOIN LATERAL (VALUES ('ok', m.ok), ('fail', m.fail), ('skip', m.skip), ('err', m.err)) AS k(prefix, n)
      WHERE m.queue <> '' AND k.n > 0
        AND m.minute >= date_trunc('minute', now() - interval '1 hour') AND m.minute < (SELECT upto FROM rolled)
      UNION ALL
      -- Grouped by prefix, not by status: statuses carry details, so there may
      -- be one per row. This predicate is jobs_finished's own, so the index serves it.
      SELECT queue, split_part(status, ': ', 1), count(*)::int
      FROM jobs
      WHERE status NOT IN ('pending', 'started') AND finished_at >= (SELECT upto FROM rolled)
      GROUP BY 1, 2
    ) AS parts
    GROUP BY 1, 2
  ) AS d
  GROUP BY queue
),
state AS (
  SELECT queue,
         CASE WHEN paused_until > now() THEN paused_until END AS paused_until,
         CASE WHEN paused_until > now() THEN pause_reason END AS pause_reason,
         CASE WHEN next_claim_at > now() THEN next_claim_at END AS throttled_until,
         scaled_to, scaled_by
  FROM job_queues
),
queues AS (
  SELECT queue FROM pending
  UNION SELECT queue FROM running
  UNION SELECT queue FROM done
  UNION SELECT queue FROM state
  UNION SELECT unnest(%(queues)s::text[])
)
SELECT q.queue, coalesce(p.pending, 0), coalesce(p.due, 0), coalesce(r.running, 0),
       extract(EPOCH FROM now() - p.oldest_due)::float8, coalesce(d.done, '{}'::jsonb),
       coalesce(p.retrying, 0), s.paused_until, s.pause_reason, s.throttled_until, s.scaled_to, s.scaled_by,
       coalesce(k.keys, 0)
FROM queues q
LEFT JOIN pending p ON p.queue = q.queue
LEFT JOIN running r ON r.queue = q.queue
LEFT JOIN done d ON d.queue = q.queue
LEFT JOIN state s ON s.queue = q.queue
LEFT JOIN keyed k ON k.queue = q.queue

-- name: queue_unrun
-- Queues with due pending rows that none of the given (registered) queues is: rows no worker will ever claim. Reads pending rows only (jobs_pending_due).
SELECT queue, count(*)::int FROM jobs
WHERE status = 'pending' AND run_at <= now() AND NOT (queue = ANY(%(registered)s::text[]))
GROUP BY queue ORDER BY queue
