-- Whether a poller of the queue sleeps waiting for a wakeup: an enqueue
-- notifies only then (sql/rules/wakeups.sql). A notifying commit takes a
-- lock every other notifying commit of the server waits for, so an enqueue
-- that notified always made the application's enqueuing transactions commit
-- one at a time. A queue's row is made by the first poller of it that sleeps.
ALTER TABLE job_queues ADD COLUMN IF NOT EXISTS wake_wanted boolean NOT NULL DEFAULT true;
