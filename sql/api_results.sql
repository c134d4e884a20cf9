-- Named queries on the tables the API queues fill.

-- name: github_repo_upsert
-- Keep the latest metadata of a repository.
INSERT INTO github_repos (full_name, data) VALUES (%(full_name)s, %(data)s::jsonb)
ON CONFLICT (full_name) DO UPDATE SET data = excluded.data, fetched_at = now()

-- name: github_user_upsert
-- Keep the latest profile of a user.
INSERT INTO github_users (login, data) VALUES (%(login)s, %(data)s::jsonb)
ON CONFLICT (login) DO UPDATE SET data = excluded.data, fetched_at = now()

-- name: apollo_organization_upsert
-- Keep the latest enrichment of an organization.
INSERT INTO apollo_organizations (domain, data) VALUES (%(domain)s, %(data)s::jsonb)
ON CONFLICT (domain) DO UPDATE SET data = excluded.data, fetched_at = now()

-- name: slack_post_begin
-- Say a post is about to be sent (ts NULL), before it is: a job that runs
-- again after an interruption finds it and does not post twice.
INSERT INTO slack_posts (job_id, channel, ts) VALUES (%(job_id)s, %(channel)s, NULL)
ON CONFLICT (job_id) DO NOTHING

-- name: slack_post_record
-- The post Slack answered for.
UPDATE slack_posts SET ts = %(ts)s, posted_at = now() WHERE job_id = %(job_id)s

-- name: slack_post_undo
-- Slack answered that it did not post (or the post was never sent): the job may post again.
DELETE FROM slack_posts WHERE job_id = %(job_id)s AND ts IS NULL

-- name: slack_post_find
-- The post a job began, if any: its ts, NULL while its answer is not recorded.
SELECT ts FROM slack_posts WHERE job_id = %(job_id)s

-- name: anthropic_answer_upsert
-- Keep the model's answer under the caller's key.
INSERT INTO anthropic_answers (key, model, prompt, answer, usage)
VALUES (%(key)s, %(model)s, %(prompt)s, %(answer)s, %(usage)s::jsonb)
ON CONFLICT (key) DO UPDATE
SET model = excluded.model, prompt = excluded.prompt, answer = excluded.answer,
    usage = excluded.usage, answered_at = now()
