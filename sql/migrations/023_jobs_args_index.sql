-- migrate: in steps
-- The admin page's search by args ({"customer_id": 42}: the jobs whose args
-- contain that object, lib/http/admin/jobs.py) reads this index instead of
-- every row: jsonb_path_ops holds one hash per path to a value, so it serves
-- `args @> '...'` alone (not ? or ?|), and is smaller and faster for it than
-- the default jsonb_ops. A query uses it only when it says `args @> <jsonb>`
-- on the bare column (sql/admin.sql, planned for its values).
--
-- In steps: built CONCURRENTLY, so writers go on while it reads the table
-- (the longest build of the upgrade: every row's args).

-- step: the search by args
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_args ON jobs USING gin (args jsonb_path_ops);
