-- Named queries on the jobs table, loaded once by lib/sql.py. Each starts with a "-- name: X"
-- line and a one-line comment that says what it is for.

-- name: job_insert
-- Enqueue one job; a unique index (dedupe) may suppress it, and then no id comes back.
INSERT INTO jobs (queue, name, args, callsite, run_at, priority, max_attempts)
VALUES (%(queue)s, %(name)s, %(args)s::jsonb, %(callsite)s,
        coalesce(%(run_at)s::timestamptz, now()), %(priority)s, %(max_attempts)s)
ON CONFLICT DO NOTHING
RETURNING id

-- name: job_insert_many
-- Enqueue a list of jobs in one statement; suppressed duplicates return no id.
INSERT INTO jobs (queue, name, args, callsite, run_at, priority, max_attempts)
SELECT queue, name, args::jsonb, %(callsite)s, coalesce(run_at, now()), priority, max_attempts
FROM unnest(%(queues)s::text[], %(names)s::text[], %(args)s::text[],
            %(run_ats)s::timestamptz[], %(priorities)s::int[], %(max_attempts)s::int[])
  WITH ORDINALITY AS j(queue, name, args, run_at, priority, max_attempts, n)
ORDER BY n
ON CONFLICT DO NOTHING
RETURNING id

-- name: job_claim
-- Move the queue's next due pending row (or the one asked for) to started in one statement, unless the queue is paused or throttled; with nothing claimed, one row of NULLs whose wait says how long until the queue may have work. The unique (queue, slot) index refuses a claim past the queue's concurrency.
WITH gate AS (
  SELECT greatest(paused_until, next_claim_at) AS until
  FROM job_queues WHERE queue = %(queue)s AND greatest(paused_until, next_claim_at) > now()
),
next AS (
  SELECT id FROM jobs
  WHERE queue = %(queue)s AND status = 'pending' AND run_at <= now()
    AND id = coalesce(%(id)s::bigint, id)  -- not an OR: that makes the cached plan look dear, and every claim re-planned
    AND NOT EXISTS (SELECT 1 FROM gate)
  ORDER BY priority DESC, run_at, id
  LIMIT 1
  -- Not SKIP LOCKED: a claimer that skipped the locked head could take the next
  -- row and win the queue's slot first, running job n+1 before job n. Waiting
  -- is brief (the other claim commits in a moment); then the head, no longer
  -- pending, is passed over and the slot index refuses this claim.
  FOR UPDATE
),
claimed AS (
  UPDATE jobs j
  SET status = 'started', started_at = now(), finished_at = NULL,
      attempts = j.attempts + 1,
      max_attempts = coalesce(j.max_attempts, %(max_attempts)s),
      worker_id = %(worker_id)s, slot = %(slot)s,
      -- From the moment of the claim, not the transaction's start: a claim
      -- that waited on a row lock longer than the lease must not commit a
      -- lease already run out.
      lease_until = clock_timestamp() + make_interval(secs => %(lease)s)
  FROM next
  WHERE j.id = next.id
  -- args as text: decoded by the worker, which can end a row whose args it cannot read.
  RETURNING j.id, j.name, j.args::text, j.attempts, j.max_attempts, j.callsite,
            greatest(extract(EPOCH FROM now() - j.run_at), 0)::float8 AS latency
)
SELECT id, name, args, attempts, max_attempts, callsite, latency, NULL::float8 AS wait,
       -- What a job_finalize sent in the same transaction wrote (NULL: none was).
       nullif(current_setting('jobs.finalized', true), '')::int AS finalized
FROM claimed
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       extract(EPOCH FROM coalesce(
         (SELECT least(until, now() + interval '1 day') FROM gate),  -- a pause may be infinite
         (SELECT min(run_at) FROM jobs
          WHERE queue = %(queue)s AND status = 'pending' AND run_at > now())
       ) - now())::float8,
       nullif(current_setting('jobs.finalized', true), '')::int
WHERE NOT EXISTS (SELECT 1 FROM claimed)

-- name: job_finalize
-- Write a claimed job's outcome by primary key (terminal, or back to pending for a retry) and hold the queue's next claim back by the throttle's delay. Safe to run twice: it matches the row still started by this claim, or already holding this very outcome.
WITH done AS (
  UPDATE jobs
  SET status = %(status)s,
      finished_at = CASE WHEN %(retry_in)s::float8 IS NULL THEN now() END,
      -- A retry waits retry_in; an interrupted job (retry_in 0) keeps its place in the queue.
      run_at = CASE WHEN coalesce(%(retry_in)s::float8, 0) = 0 THEN run_at
                    ELSE now() + make_interval(secs => %(retry_in)s::float8) END,
      last_error = coalesce(%(last_error)s, last_error),
      -- Goes with last_error: a new error replaces it (with NULL when it has none).
      last_traceback = CASE WHEN %(last_error)s::text IS NULL THEN last_traceback ELSE %(last_traceback)s END,
      -- An attempt that did not count (a snooze) gives its allowance back.
      max_attempts = max_attempts + %(uncounted)s,
      lease_until = NULL, slot = NULL
  WHERE id = %(id)s AND worker_id = %(worker_id)s AND attempts = %(attempts)s
    AND status IN ('started', %(status)s)
  RETURNING queue
),
throttled AS (
  INSERT INTO job_queues (queue, next_claim_at)
  SELECT queue, now() + make_interval(secs => %(delay)s::float8) FROM done
  WHERE %(delay)s::float8 > 0
  ON CONFLICT (queue) DO UPDATE SET next_claim_at = excluded.next_claim_at
)
-- The count is also noted for the rest of the transaction, where a claim sent with it reads it back.
SELECT set_config('jobs.finalized', count(*)::text, true)::int FROM done

-- name: job_claimed_by
-- The job a slot of this worker holds started, in job_claim's columns: what a claim whose reply was lost committed. Rows the worker already knows (runs, finalizes, gave up on) are passed over.
SELECT id, name, args::text, attempts, max_attempts, callsite,
       greatest(extract(EPOCH FROM started_at - run_at), 0)::float8, NULL::float8, NULL::int
FROM jobs
WHERE queue = %(queue)s AND slot = %(slot)s AND status = 'started' AND worker_id = %(worker_id)s
  AND NOT (id = ANY(%(known)s::bigint[]))

-- name: job_head
-- The id of the queue's next due pending row in claim order, read without a lock: the suspect when the claim fails on a value.
SELECT id FROM jobs
WHERE queue = %(queue)s AND status = 'pending' AND run_at <= now()
ORDER BY priority DESC, run_at, id
LIMIT 1

-- name: job_end_unclaimable
-- End a pending row that no claim can take (a value no insert would write), with the reason, so the rest of its queue is worked.
UPDATE jobs SET status = %(status)s, last_error = %(status)s, finished_at = now()
WHERE id = %(id)s AND status = 'pending'

-- name: job_release
-- Give back a claimed job that never ran (its poller was killed first): pending again, the attempt not counted.
UPDATE jobs
SET status = 'pending', started_at = NULL, attempts = attempts - 1,
    worker_id = NULL, slot = NULL, lease_until = NULL
WHERE id = %(id)s AND worker_id = %(worker_id)s AND attempts = %(attempts)s AND status = 'started'

-- name: queue_notify
-- Tell every worker's pollers of a queue to look now (its slot was freed, say).
SELECT pg_notify('jobs', %(queue)s)

-- name: job_heartbeat
-- Extend the lease of the rows this worker process is running now; the ids it still held.
UPDATE jobs SET lease_until = clock_timestamp() + make_interval(secs => %(lease)s)
WHERE id = ANY(%(ids)s::bigint[]) AND status = 'started' AND worker_id = %(worker_id)s
RETURNING id

-- name: job_rescue
-- Take back started rows whose worker stopped renewing the lease: to pending when
-- attempts remain (in their place in the queue: run_at is kept), else interrupted.
-- Rows from before leases existed have no lease and are taken once older than
-- legacy_age seconds. Never a row the rescuing worker holds (runs or finalizes).
UPDATE jobs
SET status = CASE WHEN attempts < coalesce(max_attempts, 1) THEN 'pending'
                  ELSE 'err: interrupted' END,
    finished_at = CASE WHEN attempts < coalesce(max_attempts, 1) THEN NULL ELSE now() END,
    last_error = 'err: interrupted',
    -- A pending row belongs to no worker: a late outcome of the lost one cannot match it.
    worker_id = CASE WHEN attempts < coalesce(max_attempts, 1) THEN NULL ELSE worker_id END,
    lease_until = NULL, slot = NULL
WHERE status = 'started'
  AND NOT (worker_id IS NOT DISTINCT FROM %(worker_id)s AND id = ANY(%(held)s::bigint[]))
  AND (lease_until < now()
       OR (lease_until IS NULL
           AND (started_at IS NULL
                OR started_at < now() - make_interval(secs => %(legacy_age)s))))
RETURNING id, queue, name, status

-- name: migration_applied
-- The versions already applied.
SELECT version FROM schema_migrations ORDER BY version

-- name: migration_record
-- Note one migration as applied, in the transaction that applied it.
INSERT INTO schema_migrations (version, name) VALUES (%(version)s, %(name)s)

-- name: job_delete_finished
-- Delete one batch of finished rows older than the retention age; small batches hold no long lock, and pending or started rows are never touched.
DELETE FROM jobs
WHERE id IN (
  SELECT id FROM jobs
  WHERE status NOT IN ('pending', 'started')
    AND finished_at < now() - make_interval(days => %(days)s)
  LIMIT %(batch)s
)

-- name: job_redrive
-- Return chosen failed jobs to pending with one more attempt allowed, keeping last_error; of identical failed copies of a deduped job only the newest, and none while a copy is pending or started. One row per chosen job: skipped is NULL when it was redriven, else why not.
WITH chosen AS (
  SELECT j.id, j.queue, j.name, j.args, j.finished_at,
         -- As the insert trigger would decide now: the names may have changed since the row was written.
         EXISTS (SELECT 1 FROM job_dedupe_names d WHERE d.queue = j.queue AND d.name = j.name) AS dedupe
  FROM jobs j
  WHERE starts_with(j.status, 'err: ')
    AND (%(ids)s::bigint[] IS NULL OR j.id = ANY(%(ids)s::bigint[]))
    AND (%(queue)s::text IS NULL OR j.queue = %(queue)s)
    AND (%(name)s::text IS NULL OR j.name = %(name)s)
),
ranked AS (
  SELECT c.id, c.dedupe,
         first_value(c.id) OVER (PARTITION BY c.queue, c.name, md5(c.args::text)
                                 ORDER BY c.finished_at DESC NULLS LAST, c.id DESC) AS newest,
         (SELECT min(o.id) FROM jobs o
          WHERE c.dedupe AND o.queue = c.queue AND o.name = c.name
            AND md5(o.args::text) = md5(c.args::text) AND o.status IN ('pending', 'started')) AS live
  FROM chosen c
),
redriven AS (
  UPDATE jobs j
  SET status = 'pending', run_at = now(), finished_at = NULL, started_at = NULL,
      max_attempts = j.attempts + 1, worker_id = NULL, slot = NULL, lease_until = NULL,
      dedupe = r.dedupe
  FROM ranked r
  WHERE j.id = r.id
    AND starts_with(j.status, 'err: ')  -- rechecked on the row as locked: another redrive may have taken it
    AND NOT (r.dedupe AND (r.live IS NOT NULL OR r.id <> r.newest))
  RETURNING j.id
)
SELECT id, NULL::text AS skipped FROM redriven
UNION ALL
SELECT id, 'job ' || CASE WHEN live IS NOT NULL THEN live || ', a copy of it, is already pending or started'
                           ELSE newest || ', a newer failure of the same job, was redriven' END
FROM ranked
WHERE dedupe AND (live IS NOT NULL OR id <> newest)
ORDER BY id
