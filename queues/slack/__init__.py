"""The slack queue: post messages.

What each Slack error code does to a job (lib.clients.slack.OUTCOMES):

- rate_limit: ratelimited, rate_limited
- bad_token: invalid_auth, not_authed, account_inactive, token_revoked,
  token_expired, missing_scope, ekm_access_denied
- bad_input: channel_not_found, not_in_channel, is_archived, msg_too_long,
  no_text, invalid_blocks, too_many_attachments, restricted_action,
  restricted_action_read_only_channel, restricted_action_thread_only_channel,
  restricted_action_non_threadable_channel, no_permission, invalid_arguments
- transient: internal_error, fatal_error, service_unavailable, request_timeout,
  team_added_to_org, org_login_required
- fault: invalid_arg_name, invalid_charset, invalid_form_data,
  invalid_post_type, missing_post_type, missing_charset, as_user_not_supported

A rate limit snoozes the job, longer each time it repeats, until 30 minutes
in a row end it (lib.run.api_queue.RATE_LIMIT_BUDGET); an unusable token pauses the queue for an hour
with one report; bad input ends the job ``fail: <code>``; a transient code
comes back with backoff, counted (lib.run.api_queue.TRANSIENT_ATTEMPTS); a fault
(any code not listed too) is err, reported. An HTTP status that is not 200
is classified by lib.clients.base.

chat.postMessage is not idempotent and Slack offers no de-duplication, so a
post is sent again only when it provably did not reach Slack (connection
refused or not made) or Slack said it did not post. After a read timeout, a
lost reply, an HTTP 5xx (which says nothing of whether it posted), or
internal_error and fatal_error ("It's possible some aspect of the operation
succeeded"), the job ends ``err: OutcomeUnknown``, final,
reported once, for a person to check the channel. The same goes for a job
stopped (a kill, a shutdown) between sending its post and recording Slack's
answer: the post is marked begun before it is sent (slack_posts, ts NULL).

Timeouts: 5 s to connect, 30 s to read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lib.clients import SlackClient
from lib.clients.api_errors import BadInputError, OutcomeUnknown
from lib.job import PendingJob, status
from lib.job.args import unmarshal_args
from lib.run.api_queue import make_api_worker, throttle_for
from lib.run.queue import Queue
from lib.store.db import DB
from lib.store.sql import Q

# chat.postMessage allows about one message a second per channel.
throttle = throttle_for(60)


@dataclass
class PostMessageArgs:
    channel: str
    text: str


def post_message(db: DB, client: SlackClient, job: PendingJob) -> str:
    args = unmarshal_args(PostMessageArgs, job.args)
    # A job run again after an interruption must not post the message twice.
    begun = db.query_row(Q.slack_post_find, {"job_id": job.id})
    if begun and begun[0] is not None:
        return status.skip("already posted")
    if begun:
        raise OutcomeUnknown(f"an earlier run sent this post and stopped before its answer: check {args.channel}")
    db.exec(Q.slack_post_begin, {"job_id": job.id, "channel": args.channel})
    try:
        answer = client.post_message(args.channel, args.text)
    except BadInputError as exc:
        db.exec(Q.slack_post_undo, {"job_id": job.id})
        return status.fail(exc.message)
    except Exception:
        # An answer, or a failure the queue tells apart (lib.run.api_queue): one
        # that may have posted ends the job final, so this run is its last.
        db.exec(Q.slack_post_undo, {"job_id": job.id})
        raise
    db.exec(Q.slack_post_record, {"job_id": job.id, "ts": answer.get("ts", "")})
    return status.ok(answer.get("ts"))


def make_worker(db: DB, client: SlackClient | None = None, **options: Any) -> Queue:
    return make_api_worker("slack", db, client, SlackClient, {"slack.PostMessage": post_message}, throttle, **options)
