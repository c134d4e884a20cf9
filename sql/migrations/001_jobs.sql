-- The jobs table in the original service's shape. Every install starts here and
-- upgrades through the later migrations, so a database that already holds a
-- table of this shape (with rows) takes the same path as a new one.
CREATE TABLE IF NOT EXISTS jobs (
  id SERIAL,
  queue text NOT NULL,
  name text NOT NULL,
  args jsonb DEFAULT '{}' NOT NULL,
  status text DEFAULT 'pending'::text NOT NULL,
  callsite text,
  created_at timestamp DEFAULT now() NOT NULL,
  started_at timestamp,
  finished_at timestamp
);
