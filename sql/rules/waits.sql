-- Jobs that wait for others. insert(..., after=[...]) writes the job, then
-- jobs_wait_for in the same transaction. A waiting job is pending and not
-- due: its run_at is the end of time (jobs_waiting_run_at) until the last job
-- it waits for ends, so it holds no slot, no rate and no budget, and never
-- stands in front of the jobs behind it in its queue. The end of a job that
-- another waits for (marked waited_on) notifies the workers (jobs_dep_ended,
-- its trigger in triggers.sql), and a worker releases the waiters
-- (jobs_release_waiters, lib/background/waits.py): due at the run_at each was
-- enqueued with, in its place in the queue; or, when a job it waits for
-- ended other than ok, ended as a skip naming that job, unless it was
-- enqueued to run whatever they end in. A job can only wait for jobs that
-- exist when it is enqueued, so no wait is ever a cycle.

-- A waiting job's run_at: later than any job is ever due.
CREATE OR REPLACE FUNCTION jobs_waiting_run_at() RETURNS timestamptz
LANGUAGE sql IMMUTABLE AS $$ SELECT '9999-12-31 00:00:00+00'::timestamptz $$;

-- Whether a job that ended so lets the jobs that wait for it run.
CREATE OR REPLACE FUNCTION jobs_ended_ok(status text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$ SELECT status = 'ok' OR starts_with(status, 'ok: ') $$;

-- The status of a waiting job that will not run: the job it waited for, and how that ended.
CREATE OR REPLACE FUNCTION jobs_skip_after(dep bigint, dep_status text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
  SELECT left(format('skip: after job %s, which ended %s', dep, regexp_replace(dep_status, '\s+', ' ', 'g')), 2000)
$$;

-- Make the job p_waiter, just written by the same statement, wait for the jobs
-- p_deps. Each must exist. They are locked in id order (two enqueues naming
-- the same jobs never deadlock) and marked, so that their end tells the
-- workers; one whose outcome is being written meanwhile is read as it
-- committed. Those that have ended already count as ended; when one ended
-- other than ok (and not p_any), the waiter ends now, as a skip naming it.
CREATE OR REPLACE FUNCTION jobs_wait_for(p_waiter bigint, p_deps bigint[], p_any boolean) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  missing bigint;
  failed record;
  live bigint[];
  due timestamptz;
BEGIN
  IF p_waiter IS NULL THEN
    RETURN;  -- dedupe suppressed the job: nothing waits
  END IF;
  IF p_waiter = ANY(p_deps) THEN
    RAISE EXCEPTION 'after: job % cannot wait for itself', p_waiter USING ERRCODE = 'check_violation';
  END IF;
  PERFORM 1 FROM jobs j WHERE j.id = ANY(p_deps) ORDER BY j.id FOR NO KEY UPDATE;
  SELECT d INTO missing FROM unnest(p_deps) d WHERE NOT EXISTS (SELECT FROM jobs j WHERE j.id = d) LIMIT 1;
  IF missing IS NOT NULL THEN
    RAISE EXCEPTION 'after: no job %', missing USING ERRCODE = 'foreign_key_violation';
  END IF;
  UPDATE jobs j SET waited_on = true WHERE j.id = ANY(p_deps) AND j.waited_on IS NOT TRUE;
  IF NOT p_any THEN
    SELECT j.id, j.status INTO failed FROM jobs j
    WHERE j.id = ANY(p_deps) AND j.status NOT IN ('pending', 'started') AND NOT jobs_ended_ok(j.status)
    ORDER BY j.id LIMIT 1;
    IF failed.id IS NOT NULL THEN
      UPDATE jobs j SET status = jobs_skip_after(failed.id, failed.status), finished_at = now() WHERE j.id = p_waiter;
      RETURN;
    END IF;
  END IF;
  SELECT array_agg(j.id ORDER BY j.id) INTO live FROM jobs j WHERE j.id = ANY(p_deps) AND j.status IN ('pending', 'started');
  IF live IS NULL THEN
    RETURN;  -- every one has ended: due as enqueued
  END IF;
  SELECT j.run_at INTO due FROM jobs j WHERE j.id = p_waiter;
  INSERT INTO job_waiters (waiter, waits, run_at, any_outcome) VALUES (p_waiter, cardinality(live), due, p_any);
  INSERT INTO job_waits (dep, waiter) SELECT d, p_waiter FROM unnest(live) d;
  UPDATE jobs j SET run_at = jobs_waiting_run_at() WHERE j.id = p_waiter;
END $$;

-- A job others wait for has ended: the workers release them.
CREATE OR REPLACE FUNCTION jobs_dep_ended() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('jobs_waits', '');
  RETURN NULL;
END $$;

-- Release every waiting job whose jobs have ended (or were deleted): due at
-- the run_at it was enqueued with, its queue woken; or ended as a skip naming
-- the first that ended other than ok. A waiter another worker is releasing is
-- passed over, and so is one whose row another transaction holds (counted in
-- held, for a later look): one held row never keeps the rest waiting. How many
-- were released or ended, and how many were held.
CREATE OR REPLACE FUNCTION jobs_release_waiters(OUT released int, OUT held int)
LANGUAGE plpgsql AS $$
DECLARE
  r record;
  waits_left int;
  woken text;
BEGIN
  released := 0;
  held := 0;
  FOR r IN
    SELECT w.dep, w.waiter, coalesce(d.status, 'deleted') AS dep_status, x.any_outcome, x.run_at
    FROM job_waits w
    JOIN job_waiters x ON x.waiter = w.waiter
    LEFT JOIN jobs d ON d.id = w.dep
    WHERE d.id IS NULL OR d.status NOT IN ('pending', 'started')
    ORDER BY w.waiter, w.dep
    FOR UPDATE OF x SKIP LOCKED
  LOOP
    PERFORM FROM jobs j WHERE j.id = r.waiter FOR UPDATE SKIP LOCKED;
    IF NOT FOUND AND EXISTS (SELECT FROM jobs j WHERE j.id = r.waiter) THEN
      held := held + 1;
      CONTINUE;
    END IF;
    DELETE FROM job_waits w WHERE w.dep = r.dep AND w.waiter = r.waiter;
    CONTINUE WHEN NOT FOUND;  -- its waiter ended at an earlier row
    IF NOT r.any_outcome AND NOT jobs_ended_ok(r.dep_status) THEN
      UPDATE jobs j SET status = jobs_skip_after(r.dep, r.dep_status), finished_at = now(), run_at = r.run_at
      WHERE j.id = r.waiter AND j.status = 'pending';
      DELETE FROM job_waits w WHERE w.waiter = r.waiter;
      DELETE FROM job_waiters x WHERE x.waiter = r.waiter;
      released := released + 1;
      CONTINUE;
    END IF;
    UPDATE job_waiters x SET waits = x.waits - 1 WHERE x.waiter = r.waiter RETURNING x.waits INTO waits_left;
    IF waits_left = 0 THEN
      DELETE FROM job_waiters x WHERE x.waiter = r.waiter;
      woken := NULL;
      UPDATE jobs j SET run_at = r.run_at WHERE j.id = r.waiter AND j.status = 'pending' RETURNING j.queue INTO woken;
      IF woken IS NOT NULL AND jobs_wake_wanted(woken) THEN
        PERFORM pg_notify('jobs', woken);
      END IF;
      released := released + 1;
    END IF;
  END LOOP;
END $$;
