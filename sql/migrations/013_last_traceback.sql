-- The traceback of the error in last_error (cut to its last 8 KiB by the
-- worker; never frame locals, so never a job's args), for `show ID`. NULL when
-- the last error was not raised (a bad status, an interruption) or predates
-- this column.
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS last_traceback text;
