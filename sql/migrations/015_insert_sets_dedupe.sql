-- The statement trigger jobs_inserted (sql/rules/triggers.sql) wakes the
-- queues of every INSERT and refuses a dedupe the writer got wrong; the row
-- trigger of 004 that it replaces goes.
DROP TRIGGER IF EXISTS jobs_notify_inserted ON jobs;
DROP FUNCTION IF EXISTS jobs_notify_inserted();
