-- Named queries of the per-minute rollup (lib/background/rollup.py) and of the charts that read it.

-- name: job_minutes_roll_up
-- Roll up the rows finished in [from, to) into one row per queue and minute, and one per minute for every queue (queue ''), replacing what an earlier roll-up of those minutes wrote (rows that committed late are counted again); a status outside the vocabulary counts as err, as /metrics counts it. The backlog column is left as it was.
WITH finished AS (
  SELECT queue, date_trunc('minute', finished_at) AS minute,
         split_part(status, ':', 1) AS kind,
         extract(EPOCH FROM started_at - run_at)::float8 AS latency
  FROM jobs
  WHERE status NOT IN ('pending', 'started') AND finished_at >= %(from)s::timestamptz AND finished_at < %(to)s::timestamptz
),
rolled AS (
  SELECT coalesce(queue, '') AS queue, minute,
         count(*) FILTER (WHERE kind = 'ok')::int AS ok,
         count(*) FILTER (WHERE kind = 'fail')::int AS fail,
         count(*) FILTER (WHERE kind = 'skip')::int AS skip,
         count(*) FILTER (WHERE kind NOT IN ('ok', 'fail', 'skip'))::int AS err,
         percentile_cont(0.5) WITHIN GROUP (ORDER BY greatest(latency, 0)) AS latency_p50,
         percentile_cont(0.95) WITHIN GROUP (ORDER BY greatest(latency, 0)) AS latency_p95
  FROM finished
  GROUP BY GROUPING SETS ((queue, minute), (minute))
)
INSERT INTO job_minutes (queue, minute, ok, fail, skip, err, latency_p50, latency_p95)
SELECT queue, minute, ok, fail, skip, err, latency_p50, latency_p95 FROM rolled
ON CONFLICT (queue, minute) DO UPDATE
SET ok = excluded.ok, fail = excluded.fail, skip = excluded.skip, err = excluded.err,
    latency_p50 = excluded.latency_p50, latency_p95 = excluded.latency_p95

-- name: job_minutes_backlog
-- The backlog at a minute's end: pending rows due now, per queue with any and for every queue (queue ''), read through jobs_pending_due.
WITH due AS (
  SELECT queue, count(*)::int AS n FROM jobs WHERE status = 'pending' AND run_at <= now() GROUP BY queue
)
INSERT INTO job_minutes (queue, minute, backlog)
SELECT queue, %(minute)s::timestamptz, n FROM due
UNION ALL
SELECT '', %(minute)s::timestamptz, coalesce(sum(n), 0)::int FROM due
ON CONFLICT (queue, minute) DO UPDATE SET backlog = excluded.backlog

-- name: job_minutes_prune
-- Forget minutes older than a moment.
DELETE FROM job_minutes WHERE minute < %(before)s

-- name: job_minutes_since
-- A queue's minutes (queue '' for every queue) from a moment on, oldest first: what a chart draws.
SELECT minute, ok, fail, skip, err, latency_p50, latency_p95, backlog
FROM job_minutes
WHERE queue = %(queue)s AND minute >= %(since)s
ORDER BY minute
