-- Read-only queries for the operator's views (lib/operate/overview.py): status, /metrics.
-- Each reads the jobs table only through a partial index (pending rows, started
-- rows, rows finished since a moment), so its cost does not grow with the
-- finished rows kept for retention.

-- name: queue_stats
-- Per queue: pending rows (due, retrying, oldest due run_at), started rows (and those of them an operator asked to cancel), rows finished in the last hour by status prefix (rolled-up minutes, then the rows since), the pause and throttle in force, the concurrency set at run time and by whom, the keys with work, the pending rows that wait for other jobs (insert's after=); for every queue with live or recent rows or job_queues state, and the names given. With rows given, each queue's pending rows are read up to an even share of that many (at least 100), earliest run_at first, and the last column is that share for a queue with more (its counts then stop there); NULL reads them all.
WITH RECURSIVE
-- The queues with pending rows, one probe of jobs_pending_due each: a read
-- of every pending row would cost what a backlog weighs.
pending_queues AS (
  (SELECT queue FROM jobs WHERE status = 'pending' ORDER BY queue LIMIT 1)
  UNION ALL
  SELECT (SELECT j.queue FROM jobs j WHERE j.status = 'pending' AND j.queue > p.queue ORDER BY j.queue LIMIT 1)
  FROM pending_queues p WHERE p.queue IS NOT NULL
),
share AS (
  SELECT CASE WHEN %(rows)s::int IS NOT NULL THEN greatest(%(rows)s::int / greatest(count(*), 1), 100)::int END AS n
  FROM pending_queues WHERE queue IS NOT NULL
),
running AS (
  SELECT queue, count(*)::int AS running, count(*) FILTER (WHERE cancel_requested IS NOT NULL)::int AS cancelling
  FROM jobs WHERE status = 'started' GROUP BY queue
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
  SELECT queue FROM pending_queues WHERE queue IS NOT NULL
  UNION SELECT queue FROM running
  UNION SELECT queue FROM done
  UNION SELECT queue FROM state
  UNION SELECT unnest(%(queues)s::text[])
)
SELECT q.queue, p.pending, p.due, coalesce(r.running, 0), coalesce(r.cancelling, 0),
       extract(EPOCH FROM now() - p.oldest_due)::float8, coalesce(d.done, '{}'::jsonb),
       p.retrying, s.paused_until, s.pause_reason, s.throttled_until, s.scaled_to, s.scaled_by,
       k.keys, CASE WHEN p.pending > share.n THEN share.n END, p.waiting
FROM queues q
CROSS JOIN share
-- Earliest run_at first, so the due rows come before the scheduled ones: a
-- queue stopped at its share still has every due row counted when one
-- scheduled row was read.
CROSS JOIN LATERAL (
  SELECT count(*)::int AS pending,
         count(*) FILTER (WHERE run_at <= now())::int AS due,
         count(*) FILTER (WHERE attempts > 0)::int AS retrying,
         count(*) FILTER (WHERE run_at = jobs_waiting_run_at())::int AS waiting,
         min(run_at) FILTER (WHERE run_at <= now()) AS oldest_due
  FROM (SELECT run_at, attempts FROM jobs WHERE status = 'pending' AND queue = q.queue
        ORDER BY run_at LIMIT share.n + 1) AS head
) AS p
-- Keys with work, through jobs_key_pending and jobs_key_started (migration 026).
CROSS JOIN LATERAL (
  SELECT count(DISTINCT key)::int AS keys
  FROM ((SELECT key FROM jobs WHERE status = 'pending' AND key IS NOT NULL AND queue = q.queue LIMIT share.n + 1)
        UNION ALL
        SELECT key FROM jobs WHERE status = 'started' AND key IS NOT NULL AND queue = q.queue) AS working
) AS k
LEFT JOIN running r ON r.queue = q.queue
LEFT JOIN done d ON d.queue = q.queue
LEFT JOIN state s ON s.queue = q.queue

-- name: queue_unrun
-- Queues with due pending rows that none of the given (registered) queues is: rows no worker will ever claim. Reads pending rows only (jobs_pending_due).
SELECT queue, count(*)::int FROM jobs
WHERE status = 'pending' AND run_at <= now() AND NOT (queue = ANY(%(registered)s::text[]))
GROUP BY queue ORDER BY queue
