-- Rates and budgets (lib/job/rate.py), across every process, decided at
-- claim by the generic cell rate algorithm. A limit's state is one moment,
-- tat (the theoretical arrival time): a claim may start a job while tat is
-- at most spacing * (burst - cost) ahead of now, and each job started moves
-- tat to greatest(tat, now) + spacing * cost. A rate costs 1 a job; a budget
-- (units a job spends, an API's tokens) reserves its most, which the job's
-- report settles (lib/run/budget.py). A queue's rate and budgets are one
-- group of job_rates rows (grp; NULL: the row's own key), named by
-- job_queues.rate_key, which a claim locks and takes from together until it
-- commits, so no two claims spend the same room; queues that name one key
-- share it.

-- Seconds until every limit of the group has room for one more job (0 or
-- less: each has now), their rows locked for the claim; no row when another
-- transaction holds any of them. A group with no rows has room. FOR NO KEY
-- UPDATE: a queue's row that names the key (a key share lock) does not wait on it.
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
