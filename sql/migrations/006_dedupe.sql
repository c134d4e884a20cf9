-- Dedupe, opted into per job name: while a row of an opted-in name is pending
-- or started, a second row with the same (queue, name, args) is refused, and
-- insert's ON CONFLICT DO NOTHING returns no id.
CREATE TABLE IF NOT EXISTS job_dedupe_names (
  queue text NOT NULL,
  name text NOT NULL,
  PRIMARY KEY (queue, name)
);

ALTER TABLE jobs ADD COLUMN IF NOT EXISTS dedupe boolean NOT NULL DEFAULT false;

-- Set here, not by the writer, so every writer (lib.insert, plain SQL, a bulk
-- INSERT ... SELECT) gets the same answer.
CREATE OR REPLACE FUNCTION jobs_set_dedupe() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  NEW.dedupe := EXISTS (
    SELECT 1 FROM job_dedupe_names d WHERE d.queue = NEW.queue AND d.name = NEW.name
  );
  RETURN NEW;
END $$;

DROP TRIGGER IF EXISTS jobs_set_dedupe ON jobs;
CREATE TRIGGER jobs_set_dedupe BEFORE INSERT ON jobs
  FOR EACH ROW EXECUTE FUNCTION jobs_set_dedupe();

-- Hashed, so args of any size fit (a btree entry holds at most about 2.7 kB).
-- jsonb's text form is canonical: key order and spacing do not matter.
CREATE UNIQUE INDEX IF NOT EXISTS jobs_dedupe
  ON jobs (queue, name, md5(args::text))
  WHERE dedupe AND status IN ('pending', 'started');
