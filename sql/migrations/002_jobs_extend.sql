-- migrate: in steps
-- Extend the original table in place: 64-bit ids, a primary key, time zones,
-- and the columns for priority, delays, retries and leases.
--
-- The table is the applications', often of millions of rows, and they go on
-- writing to it while it upgrades, so nothing here rewrites it under a lock.
-- The id and the timestamps, whose types change, get new columns beside the
-- old ones: a trigger fills them in on every row written from the first
-- step on, batches of short transactions fill in the rows already there,
-- and one short transaction swaps them in by name. NOT NULL and the primary
-- key come from a constraint validated and a unique index built beforehand,
-- each without holding writers, so the swap reads no row; every index is
-- built CONCURRENTLY. A new database takes the same steps over an empty
-- table.

-- step: new columns beside the old ones, kept in step by a trigger
ALTER TABLE jobs
  -- The original id was a 32-bit serial and never a primary key.
  ADD COLUMN new_id bigint,
  ADD COLUMN new_created_at timestamptz,
  ADD COLUMN new_started_at timestamptz,
  ADD COLUMN new_finished_at timestamptz,
  -- Checked on every write from now on, and for the rows already there by
  -- the validation after the batches; SET NOT NULL then needs no scan.
  ADD CONSTRAINT jobs_upgrade_002_filled CHECK (new_id IS NOT NULL AND new_created_at IS NOT NULL) NOT VALID,
  ADD COLUMN IF NOT EXISTS priority int NOT NULL DEFAULT 0,
  ADD COLUMN IF NOT EXISTS run_at timestamptz NOT NULL DEFAULT now(),
  ADD COLUMN IF NOT EXISTS attempts int NOT NULL DEFAULT 0,
  -- NULL until claimed: the claim fills in the queue's own setting.
  ADD COLUMN IF NOT EXISTS max_attempts int,
  ADD COLUMN IF NOT EXISTS worker_id text,
  ADD COLUMN IF NOT EXISTS lease_until timestamptz,
  ADD COLUMN IF NOT EXISTS slot int,
  ADD COLUMN IF NOT EXISTS last_error text;

-- The old columns hold now() as seen in the server's TimeZone setting; the
-- copies read them in that same zone (this session's, kept by the function
-- whatever the writer's session says), so every instant keeps its meaning.
-- Dropped by the swap below.
CREATE FUNCTION jobs_upgrade_002() RETURNS trigger LANGUAGE plpgsql SET TimeZone FROM CURRENT AS $$
BEGIN
  NEW.new_id := NEW.id;
  NEW.new_created_at := NEW.created_at;
  NEW.new_started_at := NEW.started_at;
  NEW.new_finished_at := NEW.finished_at;
  RETURN NEW;
END $$;
CREATE TRIGGER jobs_upgrade_002 BEFORE INSERT OR UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION jobs_upgrade_002();
-- Even in a session that turns triggers off (a bulk load): a row without its
-- copies would fail the check above.
ALTER TABLE jobs ENABLE ALWAYS TRIGGER jobs_upgrade_002;

-- step, in batches over jobs: the rows already there, their new columns filled in by the trigger
-- Rows the old service already ran were attempted once; without this a
-- rescued old started row would look as if it had attempts left.
UPDATE jobs
SET attempts = CASE WHEN status <> 'pending' AND attempts = 0 THEN 1 ELSE attempts END,
    max_attempts = CASE WHEN status <> 'pending' AND attempts = 0 THEN 1 ELSE max_attempts END
WHERE ctid >= %(from_tid)s::tid AND ctid < %(to_tid)s::tid
  AND (new_id IS NULL OR (status <> 'pending' AND attempts = 0));

-- step: every row shown to have its copies
ALTER TABLE jobs VALIDATE CONSTRAINT jobs_upgrade_002_filled;

-- step: the new id's unique index, the primary key's to be
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS jobs_new_id ON jobs (new_id);

-- step: the new columns take the old ones' names, in one transaction that holds the table for a moment
-- A statement an application prepared that returns the id (pgx caches its
-- statements) fails once on each connection after this, "cached plan must
-- not change result type", and is prepared again: no change of the id's
-- type can spare it that, and a 32-bit id runs out.
LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE;
-- An index, constraint or statistics of an application's own on an old
-- column would go with it unsaid: the upgrade stops instead, naming them.
DO $$
DECLARE
  held text;
BEGIN
  SELECT string_agg(pg_describe_object(d.classid, d.objid, d.objsubid), ', ') INTO held
  FROM pg_depend d JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
  WHERE d.refclassid = 'pg_class'::regclass AND d.refobjid = 'jobs'::regclass AND d.deptype = 'a'
    AND a.attname IN ('id', 'created_at', 'started_at', 'finished_at')
    AND d.classid <> 'pg_attrdef'::regclass
    AND NOT (d.classid = 'pg_class'::regclass AND d.objid = 'jobs_id_seq'::regclass)
    AND NOT (d.classid = 'pg_constraint'::regclass
             AND (SELECT contype FROM pg_constraint WHERE oid = d.objid) IN ('p', 'n'));
  IF held IS NOT NULL THEN
    RAISE EXCEPTION 'jobs upgrade: % would be dropped with the old columns', held
      USING HINT = 'Drop them, run the upgrade, then create them again on the new columns.';
  END IF;
END $$;
DROP TRIGGER jobs_upgrade_002 ON jobs;
DROP FUNCTION jobs_upgrade_002();
ALTER SEQUENCE jobs_id_seq OWNED BY jobs.new_id;
ALTER TABLE jobs DROP COLUMN id, DROP COLUMN created_at, DROP COLUMN started_at, DROP COLUMN finished_at;
ALTER TABLE jobs RENAME COLUMN new_id TO id;
ALTER TABLE jobs RENAME COLUMN new_created_at TO created_at;
ALTER TABLE jobs RENAME COLUMN new_started_at TO started_at;
ALTER TABLE jobs RENAME COLUMN new_finished_at TO finished_at;
-- Proved by the validated check, without reading a row; set after the
-- renames, so the constraints Postgres 18 names for them are named for the columns.
ALTER TABLE jobs
  ALTER COLUMN id SET NOT NULL,
  ALTER COLUMN created_at SET NOT NULL,
  ALTER COLUMN id SET DEFAULT nextval('jobs_id_seq'),
  ALTER COLUMN created_at SET DEFAULT now();
ALTER TABLE jobs DROP CONSTRAINT jobs_upgrade_002_filled, ADD CONSTRAINT jobs_pkey PRIMARY KEY USING INDEX jobs_new_id;
ALTER SEQUENCE jobs_id_seq AS bigint;

-- step: the claim's index
-- The claim reads the head of one queue's pending rows in this order.
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_claim
  ON jobs (queue, priority DESC, run_at, id) WHERE status = 'pending';

-- step: one started row per (queue, slot)
-- The database itself holds each queue to its concurrency, across every worker process.
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS jobs_started_slot
  ON jobs (queue, slot) WHERE status = 'started';

-- step: the rescue's index
-- The rescue reads started rows by lease; the set is small (one per running job).
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_started_lease
  ON jobs (lease_until) WHERE status = 'started';

-- step: retention's index
-- Retention deletes finished rows by age without reading live ones.
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_finished
  ON jobs (finished_at) WHERE status NOT IN ('pending', 'started');
