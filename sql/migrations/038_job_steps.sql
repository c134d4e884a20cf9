-- The results of jobs' steps (PendingJob.step, lib/run/job_steps.py): each
-- stored when its step returns, in a transaction of its own, so a later run
-- of the job (a retry, a run after a rescue) gets it back instead of paying
-- for the work again. No foreign key to jobs: its triggers would run on
-- every update of a job row, the claim's and the outcome's included.
-- Retention (job_delete_finished) and a fresh redrive (job_redrive) delete a
-- job's steps in the statement that deletes or restarts the job.
CREATE TABLE job_steps (
  job_id bigint NOT NULL,
  name text NOT NULL,
  result jsonb NOT NULL,
  stored_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (job_id, name)
);
