-- Who asked to cancel a started job (`worker.py cancel`, the admin page),
-- kept until the job ends: the worker running it stops its handler and ends
-- it `skip: cancelled by <who>`, and a rescue of the row ends it so too.
-- Nullable and without a default: the table is not rewritten, and the lock
-- the column takes is held for an instant.
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS cancel_requested text;
