-- Wake the pollers of a queue when it may have work, whoever wrote the row:
-- lib.insert, a plain INSERT, or a set-based INSERT ... SELECT.

-- One notification per statement and queue, however many rows it inserted.
CREATE OR REPLACE FUNCTION jobs_notify_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('jobs', queue)
  FROM (SELECT DISTINCT queue FROM inserted WHERE status = 'pending') AS q;
  RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS jobs_notify_inserted ON jobs;
CREATE TRIGGER jobs_notify_inserted
  AFTER INSERT ON jobs REFERENCING NEW TABLE AS inserted
  FOR EACH STATEMENT EXECUTE FUNCTION jobs_notify_inserted();

-- A row back to pending (a retry, a rescue, a redrive) is work. A row leaving
-- started does not notify here: the poller that ran it usually claims the
-- queue's next job in the same transaction, and a notification on every
-- finished job would serialise the commits of all queues (Postgres holds a
-- cluster-wide lock across a notifying commit). A poller that hands its slot
-- over (stopping) and the rescue notify by themselves. Postgres folds
-- identical notifications of one transaction into one.
CREATE OR REPLACE FUNCTION jobs_notify_updated() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('jobs', NEW.queue);
  RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS jobs_notify_updated ON jobs;
CREATE TRIGGER jobs_notify_updated
  AFTER UPDATE OF status ON jobs
  FOR EACH ROW
  WHEN (OLD.status IS DISTINCT FROM NEW.status AND NEW.status = 'pending')
  EXECUTE FUNCTION jobs_notify_updated();
