-- Wakeups: an enqueue notifies its queue (NOTIFY jobs, '<queue>') only when a
-- poller of the queue sleeps waiting for one. A notifying commit takes a lock
-- that every other notifying commit of the server waits for, and so shares
-- no WAL flush with them: a notification on every enqueue would make the
-- application's enqueuing transactions commit one at a time. A busy queue's
-- pollers look for their next job as they write each outcome, and need none.
--
-- job_queues.wake_wanted says a poller sleeps: set as a claim of the queue
-- finds nothing due (jobs_sleep, from the step), cleared by the next claim
-- that takes a job (step.sql). An enqueue reads it under a lock shared by
-- every enqueue of the queue and held until its commit; a poller sets it only when it has that lock alone,
-- so no enqueue that read it unset is still uncommitted, and a due job that
-- committed before is seen. Neither side ever waits on the other for more
-- than a moment: a poller that cannot have the lock looks again shortly.
-- Each side spells the lock's key (1785684596, hashtext(queue)) here alone.

-- Whether an enqueue of queue q notifies: a poller of it sleeps. A queue with
-- no row has no poller that ever slept (none runs, or none has yet gone
-- idle): nobody to wake. Takes the shared side of the queue's enqueue lock,
-- until the transaction ends.
CREATE OR REPLACE FUNCTION jobs_wake_wanted(q text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_advisory_xact_lock_shared(1785684596, hashtext(q));
  -- A statement after the lock: it sees the mark of any poller that took the lock before.
  RETURN coalesce((SELECT jq.wake_wanted FROM job_queues jq WHERE jq.queue = q), false);
END $$;

-- A poller of queue q going to sleep: 'asleep' once every later enqueue of q
-- notifies; 'due' when a job is due after all (one committed since the
-- poller looked): the poller claims instead; 'enqueuing' when an enqueue of q
-- is in flight (it may have read the mark unset): the poller looks again
-- shortly. Its one write waits for no one (lock_timeout): a queue's row held
-- a moment (a claim clearing the mark, a pause) is 'enqueuing' too. No JIT, as
-- for the step (step.sql).
CREATE OR REPLACE FUNCTION jobs_sleep(q text) RETURNS text
LANGUAGE plpgsql SET lock_timeout = '100ms' SET jit = off AS $$
BEGIN
  IF NOT pg_try_advisory_xact_lock(1785684596, hashtext(q)) THEN
    RETURN 'enqueuing';
  END IF;
  IF EXISTS (SELECT FROM jobs_due(q, NULL, 1)) THEN
    RETURN 'due';
  END IF;
  INSERT INTO job_queues (queue, wake_wanted) VALUES (q, true)
  ON CONFLICT (queue) DO UPDATE SET wake_wanted = true WHERE NOT job_queues.wake_wanted;
  RETURN 'asleep';
EXCEPTION WHEN lock_not_available THEN
  RETURN 'enqueuing';
END $$;

-- How long a poller of queue q whose claim found nothing due waits: wait (the
-- next delayed job's, or NULL: none known) once the queue's enqueues are
-- asked to wake it (jobs_sleep); a moment when a job is due after all; half
-- a second while an enqueue of q is in flight, whose commit wakes nobody.
-- The step (step.sql) asks it, so a poller goes to sleep with no round trip
-- of its own.
CREATE OR REPLACE FUNCTION jobs_asleep_wait(q text, wait float8) RETURNS float8
LANGUAGE plpgsql AS $$
BEGIN
  RETURN CASE jobs_sleep(q) WHEN 'asleep' THEN wait WHEN 'due' THEN 0.05 ELSE 0.5 END;
END $$;

-- A row back to pending (a retry, a rescue, a redrive) is work. A row leaving
-- started does not notify: the poller that ran it usually claims the queue's
-- next job in the same transaction. A poller that hands its slot over
-- (stopping) and the rescue notify by themselves.
CREATE OR REPLACE FUNCTION jobs_notify_updated() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF jobs_wake_wanted(NEW.queue) THEN
    PERFORM pg_notify('jobs', NEW.queue);
  END IF;
  RETURN NULL;
END $$;
