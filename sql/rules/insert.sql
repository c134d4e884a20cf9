-- Enqueue: lib.insert's statements as functions (their plans are kept per
-- connection, not made on every call: planning is a large share of a
-- one-job insert's server time), and what every other writer of a job row
-- (plain SQL, an INSERT ... SELECT, the clock) goes through: the triggers'
-- functions (the triggers themselves are in triggers.sql).
--
-- A row's dedupe is the database's answer, never the writer's: lib.insert's
-- statements read job_dedupe_names in the INSERT itself, in a snapshot taken
-- once it holds its lock on jobs, so a name whose declaration it waited for
-- is seen (jobs_dedupe_declare locks jobs against every writer until it
-- commits); a writer that leaves the column out gets it from the row trigger,
-- and one that names it other than job_dedupe_names says is refused whole.
--
-- Every committed pending row wakes its queue's sleeping pollers (NOTIFY
-- jobs, '<queue>', when wakeups.sql says one sleeps), whoever wrote it.
-- Postgres folds identical notifications of one transaction into one.

-- A row written without its dedupe (a writer that leaves the column out) gets it here.
CREATE OR REPLACE FUNCTION jobs_set_dedupe() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  NEW.dedupe := EXISTS (
    SELECT 1 FROM job_dedupe_names d WHERE d.queue = NEW.queue AND d.name = NEW.name
  );
  RETURN NEW;
END $$;

-- Once per statement, over the rows it inserted: refuse a dedupe the writer
-- got wrong, then wake each queue that has new pending rows and a sleeping
-- poller. One trigger for both, so a one-row insert pays for one call, not two.
CREATE OR REPLACE FUNCTION jobs_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  wrong record;
BEGIN
  SELECT i.queue, i.name, i.dedupe INTO wrong FROM inserted i
  WHERE i.dedupe <> EXISTS (SELECT FROM job_dedupe_names d WHERE d.queue = i.queue AND d.name = i.name)
  LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION 'jobs.dedupe of (%, %) must be %: it follows job_dedupe_names; leave the column out',
      wrong.queue, wrong.name, (NOT wrong.dedupe)::text
      USING ERRCODE = 'check_violation';
  END IF;
  PERFORM pg_notify('jobs', q.queue)
  FROM (SELECT DISTINCT queue FROM inserted WHERE status = 'pending') AS q
  WHERE jobs_wake_wanted(q.queue);
  RETURN NULL;
END $$;

-- One job; its id, or NULL when the dedupe index suppressed it. It wakes its
-- queue itself (when a poller sleeps), and its INSERT passes over the statement trigger jobs_inserted,
-- whose work it has no need of (it reads the row's dedupe from
-- job_dedupe_names, and knows the one queue to wake): the trigger's run (a
-- transition table, a PL/pgSQL call and two queries) would cost a one-job
-- enqueue as much of its commit as the NOTIFY itself. The mark the trigger's
-- WHEN reads is set for this INSERT alone; a transaction-local setting any
-- role may set (a custom setting in the function's SET clause needs a
-- superuser to create the function).
-- p_trace: the enqueuer's trace context (W3C traceparent, as OpenTelemetry's
-- propagator writes it), which the run's span links to; NULL untraced.
CREATE OR REPLACE FUNCTION jobs_insert(
  p_queue text, p_name text, p_args jsonb, p_callsite text, p_run_at timestamptz, p_priority int, p_max_attempts int,
  p_key text, p_trace jsonb
) RETURNS bigint
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
  written bigint;
BEGIN
  PERFORM set_config('jobs.inserting_checked', 'on', true);
  INSERT INTO jobs (queue, name, args, callsite, run_at, priority, max_attempts, key, dedupe, trace)
  VALUES (p_queue, p_name, p_args, p_callsite, coalesce(p_run_at, now()), p_priority, p_max_attempts, p_key,
          EXISTS (SELECT FROM job_dedupe_names d WHERE d.queue = p_queue AND d.name = p_name), p_trace)
  ON CONFLICT DO NOTHING
  RETURNING id INTO written;
  PERFORM set_config('jobs.inserting_checked', 'off', true);
  -- A row the dedupe index suppressed is no new work: nobody is woken, as
  -- the trigger wakes nobody for a statement that wrote no row.
  IF written IS NOT NULL AND jobs_wake_wanted(p_queue) THEN
    PERFORM pg_notify('jobs', p_queue);
  END IF;
  RETURN written;
END $$;

-- Many jobs in one statement, each column a JSON array in the jobs' order
-- (one value to send and parse per column, not one per job); the ids
-- written, in that order, a suppressed duplicate left out. One callsite and
-- one trace context for them all: one caller wrote them.
CREATE OR REPLACE FUNCTION jobs_insert_many(
  p_callsite text, p_queues jsonb, p_names jsonb, p_args jsonb, p_run_ats jsonb, p_priorities jsonb,
  p_max_attempts jsonb, p_keys jsonb, p_trace jsonb
) RETURNS SETOF bigint
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
BEGIN
  RETURN QUERY
  INSERT INTO jobs (queue, name, args, callsite, run_at, priority, max_attempts, key, dedupe, trace)
  SELECT j.queue, j.name, j.args, p_callsite, coalesce(j.run_at::timestamptz, now()), j.priority::int,
         j.max_attempts::int, j.key, EXISTS (SELECT FROM job_dedupe_names d WHERE d.queue = j.queue AND d.name = j.name),
         p_trace
  FROM ROWS FROM (jsonb_array_elements_text(p_queues), jsonb_array_elements_text(p_names),
                  jsonb_array_elements(p_args), jsonb_array_elements_text(p_run_ats),
                  jsonb_array_elements_text(p_priorities), jsonb_array_elements_text(p_max_attempts),
                  jsonb_array_elements_text(p_keys))
    WITH ORDINALITY AS j(queue, name, args, run_at, priority, max_attempts, key, n)
  ORDER BY j.n
  ON CONFLICT DO NOTHING
  RETURNING id;
END $$;

-- The same two as lib.insert from before trace contexts, and from before
-- keys, calls them: programs that enqueue with an older release's lib.insert.
CREATE OR REPLACE FUNCTION jobs_insert(
  p_queue text, p_name text, p_args jsonb, p_callsite text, p_run_at timestamptz, p_priority int, p_max_attempts int,
  p_key text
) RETURNS bigint
LANGUAGE sql AS $$
  SELECT jobs_insert(p_queue, p_name, p_args, p_callsite, p_run_at, p_priority, p_max_attempts, p_key, NULL)
$$;

CREATE OR REPLACE FUNCTION jobs_insert(
  p_queue text, p_name text, p_args jsonb, p_callsite text, p_run_at timestamptz, p_priority int, p_max_attempts int
) RETURNS bigint
LANGUAGE sql AS $$
  SELECT jobs_insert(p_queue, p_name, p_args, p_callsite, p_run_at, p_priority, p_max_attempts, NULL, NULL)
$$;

CREATE OR REPLACE FUNCTION jobs_insert_many(
  p_callsite text, p_queues jsonb, p_names jsonb, p_args jsonb, p_run_ats jsonb, p_priorities jsonb,
  p_max_attempts jsonb, p_keys jsonb
) RETURNS SETOF bigint
LANGUAGE sql AS $$
  SELECT jobs_insert_many(p_callsite, p_queues, p_names, p_args, p_run_ats, p_priorities, p_max_attempts, p_keys, NULL)
$$;

CREATE OR REPLACE FUNCTION jobs_insert_many(
  p_callsite text, p_queues jsonb, p_names jsonb, p_args jsonb, p_run_ats jsonb, p_priorities jsonb,
  p_max_attempts jsonb
) RETURNS SETOF bigint
LANGUAGE sql AS $$
  SELECT jobs_insert_many(p_callsite, p_queues, p_names, p_args, p_run_ats, p_priorities, p_max_attempts,
                          (SELECT jsonb_agg(NULL::text) FROM jsonb_array_elements(p_queues)), NULL)
$$;
