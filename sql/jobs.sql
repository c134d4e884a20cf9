-- Named queries on the jobs table, loaded once by lib/store/sql.py. Each starts with a "-- name: X"
-- line and a one-line comment that says what it is for; a "-- plan: custom" line under them
-- has the pool send it with its values, planned for them on every run (lib/store/sql.py).

-- name: job_insert
-- Enqueue one job: jobs_insert (sql/rules/insert.sql), which sends the queue its NOTIFY itself; NULL when a unique index (dedupe) suppressed it.
SELECT jobs_insert(%(queue)s::text, %(name)s::text, %(args)s::jsonb, %(callsite)s::text,
                   %(run_at)s::timestamptz, %(priority)s::int, %(max_attempts)s::int, %(key)s::text,
                   %(trace)s::jsonb)

-- name: job_insert_many
-- Enqueue a list of jobs in one statement, each column a JSON array in the order given: jobs_insert_many (sql/rules/insert.sql); suppressed duplicates return no id.
SELECT id FROM jobs_insert_many(%(callsite)s::text, %(queues)s::jsonb, %(names)s::jsonb, %(args)s::jsonb,
                                %(run_ats)s::jsonb, %(priorities)s::jsonb, %(max_attempts)s::jsonb,
                                %(keys)s::jsonb, %(trace)s::jsonb) AS id

-- name: job_insert_after
-- Enqueue one job that waits for others (insert's after=): jobs_insert, then jobs_wait_for (sql/rules/waits.sql) in the same statement, so no worker sees the job before it waits; NULL when dedupe suppressed it.
SELECT i.id
FROM jobs_insert(%(queue)s::text, %(name)s::text, %(args)s::jsonb, %(callsite)s::text,
                 %(run_at)s::timestamptz, %(priority)s::int, %(max_attempts)s::int, %(key)s::text,
                 %(trace)s::jsonb) AS i(id),
     jobs_wait_for(i.id, %(after)s::bigint[], %(any_outcome)s::boolean) AS w

-- name: job_release_waiters
-- Release the waiting jobs whose jobs have ended, or end them skipped: jobs_release_waiters (sql/rules/waits.sql); how many, and how many were held by another transaction.
SELECT released, held FROM jobs_release_waiters()

-- name: job_claim
-- Claim the queue's next due job (or the one asked for) for one slot: a lone claim (jobs_step_one, sql/rules/step.sql), in job_claimed_by's columns. With nothing claimed, one row of NULLs whose wait says how long until the queue may have work.
SELECT id, name, args, attempts, max_attempts, callsite, latency, wait, slot, trace
FROM jobs_step_one(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                   %(queue)s, %(slot)s, %(worker_id)s, %(lease)s, %(max_attempts)s, %(id)s)

-- name: job_step_one
-- A group commit of one ask (lib/run/steps.py): an outcome (o_ parameters, all NULL for none) and/or one slot's claim (c_ parameters, all NULL for none), in job_step's columns. jobs_step_one (sql/rules/step.sql).
SELECT queue, worker_id, id, name, args, attempts, max_attempts, callsite, latency, wait, slot, trace
FROM jobs_step_one(%(o_id)s, %(o_worker_id)s, %(o_attempts)s, %(o_status)s, %(o_retry_in)s, %(o_last_error)s,
                   %(o_last_traceback)s, %(o_delay)s, %(o_uncounted)s,
                   %(c_queue)s, %(c_slot)s, %(c_worker_id)s, %(c_lease)s, %(c_max_attempts)s, %(c_id)s)

-- name: job_step
-- One group commit of several asks (lib/run/steps.py): outcomes of any queues, then claims grouped by queue, in one round trip and one transaction: jobs_step (sql/rules/step.sql).
SELECT queue, worker_id, id, name, args, attempts, max_attempts, callsite, latency, wait, slot, trace
FROM jobs_step(%(o_id)s::bigint[], %(o_worker_id)s::text[], %(o_attempts)s::int[], %(o_status)s::text[],
               %(o_retry_in)s::float8[], %(o_last_error)s::text[], %(o_last_traceback)s::text[],
               %(o_delay)s::float8[], %(o_uncounted)s::int[],
               %(c_queue)s::text[], %(c_slot)s::int[], %(c_worker_id)s::text[], %(c_lease)s::float8[],
               %(c_max_attempts)s::int[], %(c_id)s::bigint[])

-- name: job_ending
-- Before an outcome that enqueues follow-ups is written, in its transaction: the row's status and whether this transaction now holds the row, while it is still this claim's (its worker and attempt); no row once it is another claim's. A row another transaction holds is not waited for.
SELECT j.status, (SELECT k.id FROM jobs k WHERE k.id = j.id FOR UPDATE SKIP LOCKED) IS NOT NULL
FROM jobs j WHERE j.id = %(id)s AND j.worker_id = %(worker_id)s AND j.attempts = %(attempts)s;

-- name: job_claimed_by
-- The job a slot of this worker holds started, in job_claim's columns: what a claim whose reply was lost committed. Rows the worker already knows (runs, finalizes, gave up on) are passed over.
SELECT id, name, args::text, attempts, max_attempts, callsite,
       greatest(extract(EPOCH FROM started_at - run_at), 0)::float8, NULL::float8, slot, trace::text
FROM jobs
WHERE queue = %(queue)s AND slot = %(slot)s AND status = 'started' AND worker_id = %(worker_id)s
  AND NOT (id = ANY(%(known)s::bigint[]))

-- name: job_head
-- The id of the queue's next due pending row in claim order, read without a lock: the suspect when the claim fails on a value.
SELECT id FROM jobs
WHERE queue = %(queue)s AND status = 'pending' AND run_at <= now()
ORDER BY -priority, run_at, id
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

-- name: database_writable
-- Whether a new transaction of this session may write: false while the database is read-only (or a standby).
SELECT current_setting('transaction_read_only') = 'off'

-- name: queue_notify
-- Tell every worker's pollers of a queue to look now (its slot was freed, say).
SELECT pg_notify('jobs', %(queue)s)

-- name: job_heartbeat
-- Extend the lease of the rows this worker process is running now; the ids it renewed, each with who asked to cancel it (NULL: nobody), the fallback for a cancel's lost NOTIFY. A row another transaction holds is passed over, not waited for: its lease alone goes unrenewed.
UPDATE jobs SET lease_until = clock_timestamp() + make_interval(secs => %(lease)s)
WHERE id IN (SELECT id FROM jobs
             WHERE id = ANY(%(ids)s::bigint[]) AND status = 'started' AND worker_id = %(worker_id)s
             FOR UPDATE SKIP LOCKED)
RETURNING id, cancel_requested

-- name: job_rescue
-- Take back started rows whose worker stopped renewing the lease: to pending when
-- attempts remain (in their place in the queue: run_at is kept), else interrupted;
-- a row an operator asked to cancel ends `skip: cancelled by <who>` whatever remains.
-- Rows from before leases existed have no lease and are taken once older than
-- legacy_age seconds. Never a row the rescuing worker holds (runs or finalizes),
-- one another transaction holds (taken at a later rescue), or one of skip (a row
-- this statement cannot write, ended alone by job_rescue_refused); with only, that row alone.
UPDATE jobs
SET status = CASE WHEN cancel_requested IS NOT NULL THEN concat('skip: cancelled by ', cancel_requested)
                  WHEN attempts < coalesce(max_attempts, 1) THEN 'pending'
                  ELSE 'err: interrupted' END,
    finished_at = CASE WHEN cancel_requested IS NULL AND attempts < coalesce(max_attempts, 1) THEN NULL
                       ELSE now() END,
    -- A cancelled job's run was stopped on purpose: no error of its own.
    last_error = CASE WHEN cancel_requested IS NULL THEN 'err: interrupted' ELSE last_error END,
    -- A pending row belongs to no worker: a late outcome of the lost one cannot match it.
    worker_id = CASE WHEN cancel_requested IS NULL AND attempts < coalesce(max_attempts, 1) THEN NULL
                     ELSE worker_id END,
    attempt_errors = CASE WHEN cancel_requested IS NULL
                          THEN jobs_attempt_errors(attempt_errors, status, attempts, worker_id, 'err: interrupted', NULL)
                          ELSE attempt_errors END,
    lease_until = NULL, slot = NULL
WHERE id IN (
  SELECT id FROM jobs
  WHERE status = 'started'
    AND id = coalesce(%(only)s::bigint, id)
    AND NOT (id = ANY(%(skip)s::bigint[]))
    AND NOT (worker_id IS NOT DISTINCT FROM %(worker_id)s AND id = ANY(%(held)s::bigint[]))
    AND (lease_until < now()
         OR (lease_until IS NULL
             AND (started_at IS NULL
                  OR started_at < now() - make_interval(secs => %(legacy_age)s))))
  FOR UPDATE SKIP LOCKED)
RETURNING id, queue, name, status

-- name: job_rescue_candidates
-- The ids job_rescue would take now, read without a lock: each is rescued alone when the statement for all of them fails on one row.
SELECT id FROM jobs
WHERE status = 'started'
  AND NOT (id = ANY(%(skip)s::bigint[]))
  AND NOT (worker_id IS NOT DISTINCT FROM %(worker_id)s AND id = ANY(%(held)s::bigint[]))
  AND (lease_until < now()
       OR (lease_until IS NULL
           AND (started_at IS NULL
                OR started_at < now() - make_interval(secs => %(legacy_age)s))))
ORDER BY id

-- name: job_rescue_refused
-- End a lost worker's row that job_rescue cannot write (no err: status fits its indexes: a name too long, say) with a status that fits, saying why.
UPDATE jobs
SET status = %(status)s, last_error = %(status)s, finished_at = now(), lease_until = NULL, slot = NULL
WHERE id = %(id)s AND status = 'started'
RETURNING id, queue, name, status

-- name: migration_applied
-- The versions already applied.
SELECT version FROM schema_migrations ORDER BY version

-- name: migration_record
-- Note one migration as applied, in the transaction that applied it.
INSERT INTO schema_migrations (version, name) VALUES (%(version)s, %(name)s)

-- name: migration_steps_done
-- The steps done of a migration in steps not yet applied (lib/store/migration_steps.py).
SELECT step FROM schema_migration_steps WHERE version = %(version)s

-- name: migration_step_record
-- Note one step of a migration in steps as done (in the step's own transaction, when it has one).
INSERT INTO schema_migration_steps (version, step) VALUES (%(version)s, %(step)s)

-- name: migration_steps_forget
-- Forget the steps of a migration, in the transaction that notes it applied.
DELETE FROM schema_migration_steps WHERE version = %(version)s

-- name: migration_index_invalid
-- Whether an index of this name is there and INVALID: a CONCURRENTLY build that failed or was stopped left it.
SELECT coalesce((SELECT NOT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%(index)s::text)), false)

-- name: migration_table_pages
-- A table's size in pages, which a batched step of a migration covers a range at a time.
SELECT (pg_relation_size(%(table)s::text::regclass) / current_setting('block_size')::int)::int

-- name: rules_due
-- The rule files (sql/rules) whose text or version differs from what the database holds, in the order given; changed: the text does (its checksum is the server's, so a worker loads no digest of its own).
SELECT f.file, r.checksum IS DISTINCT FROM encode(sha256(convert_to(f.text, 'UTF8')), 'hex') AS changed,
       r.version AS version
FROM unnest(%(files)s::text[], %(texts)s::text[]) WITH ORDINALITY AS f(file, text, n)
LEFT JOIN schema_rules r ON r.file = f.file
WHERE r.checksum IS DISTINCT FROM encode(sha256(convert_to(f.text, 'UTF8')), 'hex')
   OR r.version IS DISTINCT FROM %(version)s
ORDER BY f.n

-- name: rules_newest
-- The version of the newest release whose rules the database holds (0: none).
SELECT coalesce(max(version), 0) FROM schema_rules

-- name: rules_record
-- Note a rule file as in force at this release's version, in the transaction that applied (or checked) it.
INSERT INTO schema_rules (file, checksum, version)
VALUES (%(file)s, encode(sha256(convert_to(%(text)s, 'UTF8')), 'hex'), %(version)s)
ON CONFLICT (file) DO UPDATE SET checksum = excluded.checksum, version = excluded.version, applied_at = now()

-- name: job_delete_finished
-- Delete one batch of finished rows older than the retention age, and their steps, oldest first from finished_at >= after (the last batch's newest; NULL: from the start); the rows deleted and the newest finished_at among them. Small batches hold no long lock, and pending or started rows are never touched.
WITH gone AS (
  DELETE FROM jobs
  -- An array, not a join of jobs with itself: planning a join on id reads the
  -- low end of jobs_pkey for its estimates, over every entry the earlier
  -- batches left dead until a VACUUM (the oldest rows have the lowest ids).
  WHERE id = ANY(ARRAY(
    -- From where the last batch stopped: a scan of jobs_finished from its low
    -- end steps over those dead entries too. ">=": rows that finished in the
    -- same instant as the last batch's newest are taken by this one.
    SELECT id FROM jobs
    WHERE status NOT IN ('pending', 'started')
      AND finished_at < now() - make_interval(days => %(days)s)
      AND finished_at >= coalesce(%(after)s::timestamptz, '-infinity')
    ORDER BY finished_at
    LIMIT %(batch)s
    -- A row another transaction holds is left for a later run, not waited for.
    FOR UPDATE SKIP LOCKED
  ))
    -- Rechecked on the row as locked: a redrive may have made it pending meanwhile.
    AND status NOT IN ('pending', 'started')
  RETURNING id, finished_at
),
-- In the statement that deletes their jobs, so no step outlives its job.
-- An array, as above: the steps' primary key is read for these ids alone.
steps_gone AS (
  DELETE FROM job_steps WHERE job_id = ANY(ARRAY(SELECT id FROM gone))
)
SELECT count(*)::int, max(finished_at) FROM gone

-- name: job_redrive
-- Return chosen failed jobs to pending with one more attempt allowed, keeping last_error and, unless fresh, their steps; of identical failed copies of a deduped job only the newest, and none while a copy holds its place in jobs_dedupe (pending or started). One row per chosen job: skipped is NULL when it was redriven, else why not.
-- plan: custom
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
         -- A live copy as jobs_dedupe sees it (its predicate: the index serves this look-up),
         -- the one the redriven row would collide with. A second started copy left unmarked
         -- by a declaration (jobs_dedupe_mark) is not one: an insert does not meet it either.
         (SELECT min(o.id) FROM jobs o
          WHERE c.dedupe AND o.queue = c.queue AND o.name = c.name
            AND md5(o.args::text) = md5(c.args::text) AND o.dedupe AND o.status IN ('pending', 'started')) AS live
  FROM chosen c
),
redriven AS (
  UPDATE jobs j
  SET status = 'pending', run_at = now(), finished_at = NULL, started_at = NULL,
      max_attempts = j.attempts + 1, worker_id = NULL, slot = NULL, lease_until = NULL,
      -- A cancel asked of an earlier run is not this one's.
      dedupe = r.dedupe, cancel_requested = NULL
  FROM ranked r
  WHERE j.id = r.id
    AND starts_with(j.status, 'err: ')  -- rechecked on the row as locked: another redrive may have taken it
    AND NOT (r.dedupe AND (r.live IS NOT NULL OR r.id <> r.newest))
  RETURNING j.id
),
-- Fresh: the redriven jobs start over, their steps forgotten in the statement that redrives them.
forgotten AS (
  DELETE FROM job_steps WHERE %(fresh)s::boolean AND job_id = ANY(ARRAY(SELECT id FROM redriven))
)
SELECT id, NULL::text AS skipped FROM redriven
UNION ALL
SELECT id, 'job ' || CASE WHEN live IS NOT NULL THEN live || ', a copy of it, is already pending or started'
                           ELSE newest || ', a newer failure of the same job, was redriven' END
FROM ranked
WHERE dedupe AND (live IS NOT NULL OR id <> newest)
ORDER BY id
