-- Named queries of the clock, which enqueues the scheduled jobs (lib/background/clock.py).

-- name: clock_fire
-- Enqueue one schedule entry for one minute: once per (entry, minute) across all clocks, none while a copy of it (same queue, name and args) is pending.
WITH tick AS (
  INSERT INTO clock_ticks (name, entry, minute) VALUES (%(name)s, %(entry)s, %(minute)s)
  ON CONFLICT DO NOTHING
  RETURNING name
), job AS (
  INSERT INTO jobs (queue, name, args, callsite)
  SELECT %(queue)s, %(name)s, %(args)s::jsonb, %(callsite)s
  FROM tick
  WHERE NOT EXISTS (
    SELECT 1 FROM jobs
    WHERE queue = %(queue)s AND name = %(name)s AND args = %(args)s::jsonb AND status = 'pending'
  )
  ON CONFLICT DO NOTHING
  RETURNING id
)
SELECT (SELECT count(*) FROM tick)::int AS ticked, (SELECT id FROM job) AS id

-- name: clock_last_fired
-- The latest minute any clock acted on for a schedule entry (rows of entry '' predate entries and count for every entry of their name); NULL when none is kept.
SELECT max(minute) FROM clock_ticks WHERE name = %(name)s AND entry IN (%(entry)s, '')

-- name: clock_prune
-- Forget the minutes before the cut-off; catch-up never looks back more than a day.
DELETE FROM clock_ticks WHERE minute < %(before)s

-- name: clock_now
-- The database's time of day as it runs the statement, not as its transaction began: what the clock ticks by.
SELECT clock_timestamp()
