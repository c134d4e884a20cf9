-- lib.insert's one-job insert wakes its queue itself and passes over the
-- statement trigger jobs_inserted, whose work it has no need of: it reads
-- the row's dedupe from job_dedupe_names in its own INSERT, so there is no
-- wrong dedupe to refuse, and it knows the one queue to wake. The trigger's
-- run (a transition table, a PL/pgSQL call and two queries) costs a one-job
-- enqueue as much of its commit as the NOTIFY itself (docs/performance.md).
-- Every other writer (insert_many, plain SQL, the clock) still goes through
-- the trigger.
--
-- The function marks its own statements with a setting that holds only
-- while it runs (its SET clause); the trigger fires at the end of the
-- INSERT, inside the function, and its WHEN reads the mark.

CREATE OR REPLACE FUNCTION jobs_insert(
  p_queue text, p_name text, p_args jsonb, p_callsite text, p_run_at timestamptz, p_priority int, p_max_attempts int,
  p_key text
) RETURNS bigint
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET jobs.inserting_checked = 'on' AS $$
DECLARE
  written bigint;
BEGIN
  INSERT INTO jobs (queue, name, args, callsite, run_at, priority, max_attempts, key, dedupe)
  VALUES (p_queue, p_name, p_args, p_callsite, coalesce(p_run_at, now()), p_priority, p_max_attempts, p_key,
          EXISTS (SELECT FROM job_dedupe_names d WHERE d.queue = p_queue AND d.name = p_name))
  ON CONFLICT DO NOTHING
  RETURNING id INTO written;
  -- A row the dedupe index suppressed is no new work: nobody is woken, as
  -- the trigger wakes nobody for a statement that wrote no row.
  IF written IS NOT NULL THEN
    PERFORM pg_notify('jobs', p_queue);
  END IF;
  RETURN written;
END $$;

DROP TRIGGER jobs_inserted ON jobs;
CREATE TRIGGER jobs_inserted
  AFTER INSERT ON jobs REFERENCING NEW TABLE AS inserted
  FOR EACH STATEMENT
  WHEN (current_setting('jobs.inserting_checked', true) IS DISTINCT FROM 'on')
  EXECUTE FUNCTION jobs_inserted();
