-- migrate: in steps
-- Dedupe, opted into per job name: while a row of an opted-in name is pending
-- or started, a second row with the same (queue, name, args) is refused, and
-- insert's ON CONFLICT DO NOTHING returns no id. The rules that set and
-- declare it are in force in sql/rules/dedupe.sql and sql/rules/insert.sql.
--
-- In steps: the column's constant default is written into no row, and the
-- index is built CONCURRENTLY, so writers go on while it reads the table.

-- step: the names opted in, and each row's mark
CREATE TABLE IF NOT EXISTS job_dedupe_names (
  queue text NOT NULL,
  name text NOT NULL,
  PRIMARY KEY (queue, name)
);

ALTER TABLE jobs ADD COLUMN IF NOT EXISTS dedupe boolean NOT NULL DEFAULT false;

-- step: one live copy per (queue, name, args) of a marked row
-- Hashed, so args of any size fit (a btree entry holds at most about 2.7 kB).
-- jsonb's text form is canonical: key order and spacing do not matter.
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS jobs_dedupe
  ON jobs (queue, name, md5(args::text))
  WHERE dedupe AND status IN ('pending', 'started');
