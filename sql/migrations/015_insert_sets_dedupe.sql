-- The insert statements of lib.insert read a row's dedupe from
-- job_dedupe_names themselves, in the statement that writes it; the row
-- trigger of 006 then runs only for the writers that leave the column out
-- (plain SQL, an INSERT ... SELECT, the clock): its PL/pgSQL call per row
-- is a large share of a bulk insert's server time (docs/performance.md).
--
-- The answer stays the database's, never the writer's: a statement that
-- names a row's dedupe other than job_dedupe_names says is refused whole,
-- where the trigger used to overwrite it. A name declared meanwhile cannot
-- slip between the two reads: jobs_dedupe_declare locks jobs against every
-- writer until it commits.

-- Left out (NULL) is "ask the trigger"; NOT NULL still holds once it has run.
ALTER TABLE jobs ALTER COLUMN dedupe DROP DEFAULT;

DROP TRIGGER IF EXISTS jobs_set_dedupe ON jobs;
CREATE TRIGGER jobs_set_dedupe BEFORE INSERT ON jobs
  FOR EACH ROW WHEN (NEW.dedupe IS NULL) EXECUTE FUNCTION jobs_set_dedupe();
-- Even in a session that turns triggers off (session_replication_role =
-- replica, for a bulk load), since a row left without one no longer gets
-- false from a default. Replication's own writes name every column: they
-- never call it.
ALTER TABLE jobs ENABLE ALWAYS TRIGGER jobs_set_dedupe;

-- Once per statement, over the rows it inserted: refuse a dedupe the writer
-- got wrong, then wake each queue that has new pending rows (as 004 did).
-- One trigger for both, so a one-row insert pays for one call, not two.
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
  PERFORM pg_notify('jobs', queue)
  FROM (SELECT DISTINCT queue FROM inserted WHERE status = 'pending') AS q;
  RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS jobs_notify_inserted ON jobs;
DROP FUNCTION IF EXISTS jobs_notify_inserted();
CREATE TRIGGER jobs_inserted
  AFTER INSERT ON jobs REFERENCING NEW TABLE AS inserted
  FOR EACH STATEMENT EXECUTE FUNCTION jobs_inserted();

-- lib.insert's two statements, as functions: their plans are kept per
-- connection, not made on every call (planning is a large share of a
-- one-job insert's server time). Each reads job_dedupe_names in the INSERT
-- itself, in a snapshot taken once it holds its lock on jobs, so it sees a
-- name whose declaration it waited for. The id written, or NULL when the
-- dedupe index suppressed the job.
CREATE OR REPLACE FUNCTION jobs_insert(
  p_queue text, p_name text, p_args jsonb, p_callsite text, p_run_at timestamptz, p_priority int, p_max_attempts int
) RETURNS bigint
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
  written bigint;
BEGIN
  INSERT INTO jobs (queue, name, args, callsite, run_at, priority, max_attempts, dedupe)
  VALUES (p_queue, p_name, p_args, p_callsite, coalesce(p_run_at, now()), p_priority, p_max_attempts,
          EXISTS (SELECT FROM job_dedupe_names d WHERE d.queue = p_queue AND d.name = p_name))
  ON CONFLICT DO NOTHING
  RETURNING id INTO written;
  RETURN written;
END $$;

-- Many jobs in one statement, each column a JSON array in the jobs' order
-- (one value to send and parse per column, not one per job); the ids
-- written, in that order, a suppressed duplicate left out.
CREATE OR REPLACE FUNCTION jobs_insert_many(
  p_callsite text, p_queues jsonb, p_names jsonb, p_args jsonb, p_run_ats jsonb, p_priorities jsonb,
  p_max_attempts jsonb
) RETURNS SETOF bigint
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
BEGIN
  RETURN QUERY
  INSERT INTO jobs (queue, name, args, callsite, run_at, priority, max_attempts, dedupe)
  SELECT j.queue, j.name, j.args, p_callsite, coalesce(j.run_at::timestamptz, now()), j.priority::int,
         j.max_attempts::int, EXISTS (SELECT FROM job_dedupe_names d WHERE d.queue = j.queue AND d.name = j.name)
  FROM ROWS FROM (jsonb_array_elements_text(p_queues), jsonb_array_elements_text(p_names),
                  jsonb_array_elements(p_args), jsonb_array_elements_text(p_run_ats),
                  jsonb_array_elements_text(p_priorities), jsonb_array_elements_text(p_max_attempts))
    WITH ORDINALITY AS j(queue, name, args, run_at, priority, max_attempts, n)
  ORDER BY j.n
  ON CONFLICT DO NOTHING
  RETURNING id;
END $$;
