-- Budgets (lib/job/rate.py's Budget): units a queue's jobs spend (an API's
-- tokens) within a limit a period, across every process. A budget is a row
-- of job_rates like a rate, and the same cell rate algorithm decides at
-- claim, with two changes: a claim reserves `cost` units (a rate's 1; a
-- budget's most, the most one job spends), and a queue's rate and budgets
-- are one group (grp; NULL: the row's own key) that a claim locks and takes
-- from together. The job reports what it spent (jobs_budget_spend), which
-- settles its reservation. The step functions (025, 026) are unchanged:
-- they ask jobs_rate_wait and jobs_rate_take of the key job_queues names,
-- which is now the group's.
ALTER TABLE job_rates
  ADD COLUMN grp text,
  ADD COLUMN cost float8 NOT NULL DEFAULT 1;
ALTER TABLE job_rates ADD CONSTRAINT job_rates_cost CHECK (cost > 0 AND cost <= burst);
CREATE INDEX job_rates_grp ON job_rates ((coalesce(grp, key)));

-- A queue with budgets and no rate names a group that has no row of its own key.
ALTER TABLE job_queues DROP CONSTRAINT IF EXISTS job_queues_rate_key_fkey;

-- Seconds until every limit of the group has room for one more job (0 or
-- less: each has now), their rows locked for the claim; no row when another
-- transaction holds any of them. A group with no rows has room.
CREATE OR REPLACE FUNCTION jobs_rate_wait(k text) RETURNS TABLE (wait float8)
LANGUAGE sql AS $$
  WITH locked AS (
    SELECT extract(EPOCH FROM greatest(r.tat, now()) - now())::float8 - r.spacing * (r.burst - r.cost) AS wait
    FROM job_rates r WHERE coalesce(r.grp, r.key) = k
    FOR NO KEY UPDATE SKIP LOCKED
  )
  SELECT max(locked.wait) FROM locked
  HAVING count(*) = (SELECT count(*) FROM job_rates r WHERE coalesce(r.grp, r.key) = k)
$$;

-- A job started under the group: each limit takes its cost.
CREATE OR REPLACE FUNCTION jobs_rate_take(k text) RETURNS void
LANGUAGE sql AS $$
  UPDATE job_rates SET tat = greatest(tat, now()) + make_interval(secs => spacing * cost)
  WHERE coalesce(grp, key) = k
$$;
