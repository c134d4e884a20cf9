-- The triggers on jobs (their functions are in insert.sql). Each statement
-- here takes a lock on the table that writers wait behind, so this file is
-- applied only when it changes, under a short lock_timeout, tried again
-- until it has the table (lib/store/migrate.py).

-- A row written without its dedupe gets it before it is stored.
CREATE OR REPLACE TRIGGER jobs_set_dedupe BEFORE INSERT ON jobs
  FOR EACH ROW WHEN (NEW.dedupe IS NULL) EXECUTE FUNCTION jobs_set_dedupe();
-- Even in a session that turns triggers off (session_replication_role =
-- replica, for a bulk load): a row left without one would break NOT NULL.
-- Replication's own writes name every column: they never call it.
ALTER TABLE jobs ENABLE ALWAYS TRIGGER jobs_set_dedupe;
-- The trigger decides the dedupe of a row written without it, so the column
-- has no default: a default is filled in before the trigger sees the row.
ALTER TABLE jobs ALTER COLUMN dedupe DROP DEFAULT;

-- Every writer but jobs_insert (which marks its own INSERT): a wrong dedupe
-- refused, and each queue with new pending rows woken.
CREATE OR REPLACE TRIGGER jobs_inserted
  AFTER INSERT ON jobs REFERENCING NEW TABLE AS inserted
  FOR EACH STATEMENT
  WHEN (current_setting('jobs.inserting_checked', true) IS DISTINCT FROM 'on')
  EXECUTE FUNCTION jobs_inserted();

-- A row made pending, or moved in its order while pending, is noted for the
-- claims that read on from their queue's newest claim (jobs_due).
CREATE OR REPLACE TRIGGER jobs_made_pending BEFORE UPDATE ON jobs
  FOR EACH ROW WHEN (NEW.status = 'pending') EXECUTE FUNCTION jobs_made_pending();

-- A row back to pending wakes its queue.
CREATE OR REPLACE TRIGGER jobs_notify_updated
  AFTER UPDATE OF status ON jobs
  FOR EACH ROW
  WHEN (OLD.status IS DISTINCT FROM NEW.status AND NEW.status = 'pending')
  EXECUTE FUNCTION jobs_notify_updated();

-- The end of a job others wait for tells the workers, which release them
-- (waits.sql). Only a marked row runs it: the WHEN costs every other update
-- one comparison.
CREATE OR REPLACE TRIGGER jobs_dep_ended
  AFTER UPDATE OF status ON jobs
  FOR EACH ROW
  WHEN (NEW.waited_on AND OLD.status IN ('pending', 'started') AND NEW.status NOT IN ('pending', 'started'))
  EXECUTE FUNCTION jobs_dep_ended();
