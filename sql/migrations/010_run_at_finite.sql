-- migrate: in steps
-- run_at must be a real moment. 'infinity' or '-infinity', written by hand or by
-- older code, made every claim of its queue fail (no interval can be taken from
-- them), so such a row stopped its whole queue. Rows already holding one are
-- mended: '-infinity' meant "as soon as possible"; 'infinity' meant "never",
-- which a queue has no way to honour, so such a pending row ends now with the
-- reason.
--
-- In steps, so no writer waits while the table is read: the constraint is
-- added NOT VALID (every write from then on is checked, no row is read), the
-- rows already there are mended in batches, and a validation that holds no
-- writer then reads them all.

-- step: a run_at that is no moment refused from now on
-- A writer of such a row gets this constraint's name in its error.
ALTER TABLE jobs ADD CONSTRAINT jobs_run_at_finite CHECK (isfinite(run_at)) NOT VALID;

-- step, in batches over jobs: the rows already holding one, mended
UPDATE jobs
SET run_at = created_at,
    status = CASE WHEN run_at = 'infinity' AND status = 'pending'
                  THEN 'err: run_at was infinity, so it would never be due' ELSE status END,
    last_error = CASE WHEN run_at = 'infinity' AND status = 'pending'
                      THEN 'err: run_at was infinity, so it would never be due' ELSE last_error END,
    finished_at = CASE WHEN run_at = 'infinity' AND status = 'pending' THEN now() ELSE finished_at END
WHERE ctid >= %(from_tid)s::tid AND ctid < %(to_tid)s::tid AND NOT isfinite(run_at);

-- step: every row shown to hold a moment
ALTER TABLE jobs VALIDATE CONSTRAINT jobs_run_at_finite;
