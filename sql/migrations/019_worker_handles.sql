-- The job names each worker handles, per queue: {"queue": ["name", ...]}.
-- A poller that claims a job of a name it does not handle asks whether a
-- live worker does (one of a newer release, during a rolling upgrade), and
-- leaves the job to it instead of ending it. A worker of a release that
-- writes no handles gets '{}': as far as the others know it handles nothing,
-- and it ends a name it does not know as it always did.
ALTER TABLE workers ADD COLUMN IF NOT EXISTS handles jsonb NOT NULL DEFAULT '{}';
