-- run_at must be a real moment. 'infinity' or '-infinity', written by hand or by
-- older code, made every claim of its queue fail (no interval can be taken from
-- them), so such a row stopped its whole queue. Rows already holding one are
-- mended first: '-infinity' meant "as soon as possible"; 'infinity' meant
-- "never", which a queue has no way to honour, so such a pending row ends now
-- with the reason.
UPDATE jobs SET status = 'err: run_at was infinity, so it would never be due',
                last_error = 'err: run_at was infinity, so it would never be due',
                finished_at = now()
WHERE run_at = 'infinity' AND status = 'pending';
UPDATE jobs SET run_at = created_at WHERE NOT isfinite(run_at);

-- A writer of such a row now gets this constraint's name in its error.
ALTER TABLE jobs ADD CONSTRAINT jobs_run_at_finite CHECK (isfinite(run_at));
