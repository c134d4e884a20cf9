-- The enqueuer's trace context (W3C traceparent, as OpenTelemetry's
-- propagator writes it; lib.insert stores it when the caller runs inside a
-- span), which the run's span links to. Nullable and without a default: the
-- table is not rewritten, and the lock the column takes is held for an instant.
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS trace jsonb;
