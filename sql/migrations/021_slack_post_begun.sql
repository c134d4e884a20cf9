-- A slack_posts row is written before the post is sent, with no ts: a job
-- that finds such a row was stopped (killed, shut down) between sending and
-- recording, so its message may be posted; it ends OutcomeUnknown instead
-- of posting it again. The ts is filled in when Slack answers.
ALTER TABLE slack_posts ALTER COLUMN ts DROP NOT NULL;
