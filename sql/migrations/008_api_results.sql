-- What the API queues fetched or produced, one table each, upserted by key.
CREATE TABLE IF NOT EXISTS github_repos (
  full_name text PRIMARY KEY,
  data jsonb NOT NULL,
  fetched_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS github_users (
  login text PRIMARY KEY,
  data jsonb NOT NULL,
  fetched_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS apollo_organizations (
  domain text PRIMARY KEY,
  data jsonb NOT NULL,
  fetched_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS slack_posts (
  job_id bigint PRIMARY KEY,
  channel text NOT NULL,
  ts text NOT NULL,
  posted_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS anthropic_answers (
  key text PRIMARY KEY,
  model text NOT NULL,
  prompt text NOT NULL,
  answer text NOT NULL,
  usage jsonb,
  answered_at timestamptz NOT NULL DEFAULT now()
);
