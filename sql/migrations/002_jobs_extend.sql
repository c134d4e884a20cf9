-- Extend the original table in place: 64-bit ids, a primary key, time zones,
-- and the columns for priority, delays, retries and leases.

-- The original id was a 32-bit serial and never a primary key.
ALTER TABLE jobs ALTER COLUMN id TYPE bigint;
ALTER SEQUENCE IF EXISTS jobs_id_seq AS bigint;
DO $$
BEGIN
  IF NOT EXISTS (
    SELECT 1 FROM pg_constraint WHERE conrelid = 'jobs'::regclass AND contype = 'p'
  ) THEN
    ALTER TABLE jobs ADD PRIMARY KEY (id);
  END IF;
END $$;

-- The old columns hold now() as seen in the server's TimeZone setting; the
-- conversion reads them in that same zone, so every instant keeps its meaning.
ALTER TABLE jobs
  ALTER COLUMN created_at TYPE timestamptz,
  ALTER COLUMN started_at TYPE timestamptz,
  ALTER COLUMN finished_at TYPE timestamptz;

ALTER TABLE jobs
  ADD COLUMN IF NOT EXISTS priority int NOT NULL DEFAULT 0,
  ADD COLUMN IF NOT EXISTS run_at timestamptz NOT NULL DEFAULT now(),
  ADD COLUMN IF NOT EXISTS attempts int NOT NULL DEFAULT 0,
  -- NULL until claimed: the claim fills in the queue's own setting.
  ADD COLUMN IF NOT EXISTS max_attempts int,
  ADD COLUMN IF NOT EXISTS worker_id text,
  ADD COLUMN IF NOT EXISTS lease_until timestamptz,
  ADD COLUMN IF NOT EXISTS slot int,
  ADD COLUMN IF NOT EXISTS last_error text;

-- Rows the old service already ran were attempted once; without this a rescued
-- old started row would look as if it had attempts left.
UPDATE jobs SET attempts = 1, max_attempts = 1 WHERE status <> 'pending' AND attempts = 0;

-- The claim reads the head of one queue's pending rows in this order.
CREATE INDEX IF NOT EXISTS jobs_claim
  ON jobs (queue, priority DESC, run_at, id) WHERE status = 'pending';

-- One started row per (queue, slot): the database itself holds each queue to
-- its concurrency, across every worker process.
CREATE UNIQUE INDEX IF NOT EXISTS jobs_started_slot
  ON jobs (queue, slot) WHERE status = 'started';

-- The rescue reads started rows by lease; the set is small (one per running job).
CREATE INDEX IF NOT EXISTS jobs_started_lease
  ON jobs (lease_until) WHERE status = 'started';

-- Retention deletes finished rows by age without reading live ones.
CREATE INDEX IF NOT EXISTS jobs_finished
  ON jobs (finished_at) WHERE status NOT IN ('pending', 'started');
