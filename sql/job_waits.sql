-- Named queries on the waits of jobs (job_waiters, job_waits: insert's
-- after=, sql/rules/waits.sql), for a person (show, the admin page).

-- name: job_waits_listed
-- A job's waits now: the jobs it waits for that have not ended (its own true), then the jobs waiting for it (false), each with its status (NULL: deleted), at most limit of each.
(SELECT true, w.dep, j.status FROM job_waits w LEFT JOIN jobs j ON j.id = w.dep
 WHERE w.waiter = %(id)s::bigint ORDER BY w.dep LIMIT %(limit)s::int)
UNION ALL
(SELECT false, w.waiter, j.status FROM job_waits w LEFT JOIN jobs j ON j.id = w.waiter
 WHERE w.dep = %(id)s::bigint ORDER BY w.waiter LIMIT %(limit)s::int)
