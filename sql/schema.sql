-- The tables and indexes as the migrations leave them, to read in one place.
-- The database is made by the numbered migrations (sql/migrations), which
-- also upgrade a table of the original service's shape in place; the
-- functions and triggers are the rules of sql/rules. tests/db/test_schema.py
-- holds a database made from this file and the rules equal to one migrated
-- from empty, one upgraded from the original table, and one upgraded from
-- migration 034.

-- Every job, pending, started or finished: a job is a row.
CREATE TABLE jobs (
  id bigserial PRIMARY KEY,  -- identity, and the tie-break of a queue's order
  queue text NOT NULL,  -- which poller
  name text NOT NULL,  -- which handler
  args jsonb NOT NULL DEFAULT '{}',  -- the payload; part of the dedupe key
  -- 'pending', 'started', or an outcome: 'ok', 'fail: ...', 'skip: ...', 'err: ...' (lib/job/status.py)
  status text NOT NULL DEFAULT 'pending',
  callsite text,  -- file:line of the enqueue
  created_at timestamptz NOT NULL DEFAULT now(),
  started_at timestamptz,
  finished_at timestamptz,
  priority int NOT NULL DEFAULT 0,  -- higher first
  run_at timestamptz NOT NULL DEFAULT now(),  -- not due before this
  attempts int NOT NULL DEFAULT 0,
  max_attempts int,  -- NULL until claimed: the claim fills in the queue's own setting
  worker_id text,  -- the worker process whose claim this is
  lease_until timestamptz,  -- the claim holds until then without a renewal
  slot int,  -- which of the queue's slots runs it
  last_error text,  -- the last error, kept across retries and redrives
  -- Whether the row holds the dedupe index while it is live: job_dedupe_names
  -- decides, never the writer (sql/rules/insert.sql), so it has no default.
  dedupe boolean NOT NULL,
  last_traceback text,  -- the last error's traceback
  attempt_errors jsonb,  -- each attempt's error, oldest first
  key text,  -- the order of its own within the queue: one started job per key
  -- Where the queue's order stood at the row's claim, so that the next claim
  -- reads on from there (jobs_due): the claims' order, its slot, kept after
  -- the outcome frees the slot (a slot's holder is its newest claim), the
  -- claim's snapshot (none for a job asked for by id) and run_at as claimed.
  claim_seq bigint,
  claim_slot int,
  claim_snapshot pg_snapshot,
  claim_run_at timestamptz,
  -- The transaction that last made the row pending or moved it while pending.
  pending_xid xid8 DEFAULT pg_current_xact_id(),
  -- Who asked to cancel the job while it ran (migration 039), kept until it
  -- ends: its worker stops it, and a rescue ends it cancelled.
  cancel_requested text,
  waited_on boolean,  -- another job waits for this one (job_waits): its end tells the workers
  trace jsonb,  -- the enqueuer's trace context (W3C traceparent), which the run's span links to
  CONSTRAINT jobs_run_at_finite CHECK (isfinite(run_at))
);
CREATE SEQUENCE jobs_claim_seq;

-- A queue's head in its order (priority highest first, as its negation, so
-- that a place in the order is one row to compare with), read by every claim.
CREATE INDEX jobs_claim ON jobs (queue, (-priority), run_at, id) WHERE status = 'pending';
-- The started rows, for the rescue and the counts.
CREATE INDEX jobs_started ON jobs (queue, slot) WHERE status = 'started';
-- Each queue's and each slot's newest claims, read newest first (jobs_due,
-- jobs_slot_holder); and the rows made pending since a snapshot, for the
-- reads that compare pending_xid only (every row has one: the predicate keeps
-- a read of a queue's pending rows by other columns off this index).
CREATE INDEX jobs_claims ON jobs (queue, claim_seq DESC) WHERE claim_seq IS NOT NULL;
CREATE INDEX jobs_slot_claims ON jobs (queue, claim_slot, claim_seq DESC) WHERE claim_seq IS NOT NULL;
CREATE INDEX jobs_pending_xid ON jobs (queue, pending_xid) WHERE status = 'pending' AND pending_xid IS NOT NULL;
-- Retention deletes finished rows by age without reading live ones.
CREATE INDEX jobs_finished ON jobs (finished_at) WHERE status NOT IN ('pending', 'started');
-- While a row of a dedupe name is live, no second copy (hashed: args of any size fit).
CREATE UNIQUE INDEX jobs_dedupe ON jobs (queue, name, md5(args::text))
  WHERE dedupe AND status IN ('pending', 'started');
-- Pending counts of a queue, due and delayed, from the index alone.
CREATE INDEX jobs_pending_due ON jobs (queue, run_at) INCLUDE (attempts) WHERE status = 'pending';
-- The failures, by age and by queue and name (`worker.py failed`, the admin page).
CREATE INDEX jobs_failed ON jobs (finished_at) WHERE starts_with(status, 'err: ');
CREATE INDEX jobs_failed_queue ON jobs (queue, name, finished_at) WHERE starts_with(status, 'err: ');
-- The admin page's search by args ({"customer_id": 42}).
CREATE INDEX jobs_args ON jobs USING gin (args jsonb_path_ops);
-- At most one started job per queue and key; and a claim's look for a key's
-- started or earlier due job.
CREATE UNIQUE INDEX jobs_key_started ON jobs (queue, key) WHERE status = 'started' AND key IS NOT NULL;
CREATE INDEX jobs_key_pending ON jobs (queue, key, priority DESC, run_at, id)
  WHERE status = 'pending' AND key IS NOT NULL;
-- The admin page's lists by time, on a table of any size.
CREATE INDEX jobs_created ON jobs USING brin (created_at timestamptz_minmax_multi_ops);

-- Per queue: a pause, the throttle's next allowed claim, the key of its rate
-- and budgets, the concurrency set at run time (`worker.py scale`), and
-- whether a poller sleeps waiting for a wakeup (sql/rules/wakeups.sql).
CREATE TABLE job_queues (
  queue text PRIMARY KEY,
  paused_until timestamptz,
  pause_reason text,
  next_claim_at timestamptz,
  rate_key text,
  scaled_to int CHECK (scaled_to >= 1),
  scaled_by text,
  scaled_at timestamptz,
  wake_wanted boolean NOT NULL DEFAULT true
);

-- Rates and budgets (sql/rules/rates.sql): a limit's moment (tat), its
-- spacing, burst and a claim's cost; a queue's limits are one group.
CREATE TABLE job_rates (
  key text PRIMARY KEY,
  spacing float8 NOT NULL CHECK (spacing > 0),
  burst int NOT NULL CHECK (burst >= 1),
  tat timestamptz NOT NULL DEFAULT '-infinity',
  grp text,
  cost float8 NOT NULL DEFAULT 1,
  CONSTRAINT job_rates_cost CHECK (cost > 0 AND cost <= burst)
);
CREATE INDEX job_rates_grp ON job_rates ((coalesce(grp, key)));

-- The result of each step a job's handler has run (PendingJob.step), so a
-- later run of the job gets it back; deleted with its job (job_delete_finished).
CREATE TABLE job_steps (
  job_id bigint NOT NULL,
  name text NOT NULL,
  result jsonb NOT NULL,
  stored_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (job_id, name)
);

-- A job that waits for others (insert(..., after=[...]), sql/rules/waits.sql):
-- how many have not ended, when it is due once they have (its row's run_at is
-- the end of time meanwhile), and whether it runs whatever they end in.
CREATE TABLE job_waiters (
  waiter bigint PRIMARY KEY,
  waits int NOT NULL,
  run_at timestamptz NOT NULL,
  any_outcome boolean NOT NULL
);
-- Each job a waiting job waits for and has not seen end.
CREATE TABLE job_waits (
  dep bigint NOT NULL,
  waiter bigint NOT NULL,
  PRIMARY KEY (dep, waiter)
);
CREATE INDEX job_waits_waiter ON job_waits (waiter);

-- The job names whose pending or started copies are unique.
CREATE TABLE job_dedupe_names (
  queue text NOT NULL,
  name text NOT NULL,
  PRIMARY KEY (queue, name)
);

-- The minutes each schedule entry fired, once whatever the number of clocks.
CREATE TABLE clock_ticks (
  name text NOT NULL,
  minute timestamptz NOT NULL,
  entry text NOT NULL DEFAULT '',  -- a digest of what the entry enqueues; '' from before entries
  PRIMARY KEY (name, entry, minute)
);

-- Per queue and minute: the jobs that ended by kind, their start latency and
-- the backlog, for the admin page's charts.
CREATE TABLE job_minutes (
  queue text NOT NULL,
  minute timestamptz NOT NULL,
  ok int NOT NULL DEFAULT 0,
  fail int NOT NULL DEFAULT 0,
  skip int NOT NULL DEFAULT 0,
  err int NOT NULL DEFAULT 0,
  latency_p50 float8,
  latency_p95 float8,
  backlog int,
  PRIMARY KEY (queue, minute)
);
CREATE INDEX job_minutes_minute ON job_minutes (minute);

-- The worker processes running now: their queues, the job names they
-- handle, and when each was last seen.
CREATE TABLE workers (
  id text PRIMARY KEY,
  host text NOT NULL,
  pid int NOT NULL,
  queues text[] NOT NULL,
  started_at timestamptz NOT NULL,
  last_seen timestamptz NOT NULL,
  lease_seconds float8 NOT NULL,
  handles jsonb NOT NULL DEFAULT '{}'
);

-- The queues' own data.
CREATE TABLE cache_entries (
  key text PRIMARY KEY,
  value jsonb NOT NULL,
  expires_at timestamptz NOT NULL
);
CREATE INDEX cache_entries_expires ON cache_entries (expires_at);

CREATE TABLE github_repos (
  full_name text PRIMARY KEY,
  data jsonb NOT NULL,
  fetched_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE github_users (
  login text PRIMARY KEY,
  data jsonb NOT NULL,
  fetched_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE apollo_organizations (
  domain text PRIMARY KEY,
  data jsonb NOT NULL,
  fetched_at timestamptz NOT NULL DEFAULT now()
);

-- Written before its post is sent, so a post is never sent twice.
CREATE TABLE slack_posts (
  job_id bigint PRIMARY KEY,
  channel text NOT NULL,
  ts text,
  posted_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE anthropic_answers (
  key text PRIMARY KEY,
  model text NOT NULL,
  prompt text NOT NULL,
  answer text NOT NULL,
  usage jsonb,
  answered_at timestamptz NOT NULL DEFAULT now()
);

-- What lib/store/migrate.py has applied: the numbered migrations, the steps
-- of one under way, and each rule file with the version of the release that
-- applied it.
CREATE TABLE schema_migrations (
  version int PRIMARY KEY,
  name text NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT now()
);

-- The steps done of a migration in steps that is not yet applied: a run
-- that stopped midway resumes at the next.
CREATE TABLE schema_migration_steps (
  version int NOT NULL,
  step int NOT NULL,
  done_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (version, step)
);

CREATE TABLE schema_rules (
  file text PRIMARY KEY,
  checksum text NOT NULL,
  version int NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT now()
);
