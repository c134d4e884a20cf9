"""The slack queue: post messages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lib import status
from lib.api_queue import make_api_worker, throttle_for
from lib.args import unmarshal_args
from lib.clients import SlackClient
from lib.db import DB
from lib.poller import PendingJob, Poller
from lib.sql import Q

# chat.postMessage allows about one message a second per channel.
throttle = throttle_for(60)


@dataclass
class PostMessageArgs:
    channel: str
    text: str


def post_message(db: DB, client: SlackClient, job: PendingJob) -> str:
    args = unmarshal_args(PostMessageArgs, job.args)
    # A job run again after an interruption must not post the message twice.
    if db.query_row(Q.slack_post_find, {"job_id": job.id}):
        return status.skip("already posted")
    answer = client.post_message(args.channel, args.text)
    db.exec(Q.slack_post_record, {"job_id": job.id, "channel": args.channel, "ts": answer.get("ts", "")})
    return status.ok(answer.get("ts"))


def make_worker(db: DB, client: SlackClient | None = None, **options: Any) -> Poller:
    return make_api_worker("slack", db, client, SlackClient, {"slack.PostMessage": post_message}, throttle, **options)
