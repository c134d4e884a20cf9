-- Budgets (lib/job/rate.py's Budget): units a queue's jobs spend (an API's
-- tokens) within a limit a period, across every process. A budget is a row
-- of job_rates like a rate, and the same cell rate algorithm decides at
-- claim, with two changes: a claim reserves `cost` units (a rate's 1; a
-- budget's most, the most one job spends), and a queue's rate and budgets
-- are one group (grp; NULL: the row's own key) that a claim locks and takes
-- from together. The job reports what it spent, which settles its
-- reservation. The rules in force: sql/rules/rates.sql.
ALTER TABLE job_rates
  ADD COLUMN grp text,
  ADD COLUMN cost float8 NOT NULL DEFAULT 1;
ALTER TABLE job_rates ADD CONSTRAINT job_rates_cost CHECK (cost > 0 AND cost <= burst);
CREATE INDEX job_rates_grp ON job_rates ((coalesce(grp, key)));

-- A queue with budgets and no rate names a group that has no row of its own key.
ALTER TABLE job_queues DROP CONSTRAINT IF EXISTS job_queues_rate_key_fkey;
