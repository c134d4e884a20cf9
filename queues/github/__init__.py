"""The github queue: fetch repository metadata and user profiles."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from lib.clients import GitHubClient
from lib.clients.api_errors import NotFoundError
from lib.job import Budget, PendingJob, status
from lib.job.args import unmarshal_args
from lib.run.api_queue import make_api_worker, throttle_for
from lib.run.queue import Queue
from lib.store.db import DB
from lib.store.sql import Q

# GitHub allows 5,000 requests an hour to an authenticated user: one job, one
# request. The budget holds the hour across every process and follows what
# each answer says is left (x-ratelimit-remaining), so other programs'
# requests with the same token count too; the throttle, 83 a minute in each
# process, keeps one process from spending the hour in a burst.
throttle = throttle_for(5000 / 60)
BUDGETS = (Budget("requests", 5_000, per=3600, most=1),)


@dataclass
class FetchRepoArgs:
    owner: str
    repo: str


@dataclass
class FetchUserArgs:
    login: str


def fetch_repo(db: DB, client: GitHubClient, job: PendingJob) -> str:
    args = unmarshal_args(FetchRepoArgs, job.args)
    try:
        data = client.get_repo(args.owner, args.repo)
    except NotFoundError:
        return status.fail(f"no repository {args.owner}/{args.repo}")
    db.exec(
        Q.github_repo_upsert,
        {"full_name": data.get("full_name", f"{args.owner}/{args.repo}"), "data": json.dumps(data)},
    )
    return status.ok(data.get("full_name"))


def fetch_user(db: DB, client: GitHubClient, job: PendingJob) -> str:
    args = unmarshal_args(FetchUserArgs, job.args)
    try:
        data = client.get_user(args.login)
    except NotFoundError:
        return status.fail(f"no user {args.login}")
    db.exec(Q.github_user_upsert, {"login": data.get("login", args.login), "data": json.dumps(data)})
    return status.ok(args.login)


def make_worker(db: DB, client: GitHubClient | None = None, **options: Any) -> Queue:
    """The github queue. Outcomes are lib.clients.github.OUTCOMES:

    ==========================================  ==========  =====================
    answer                                      outcome     the job
    ==========================================  ==========  =====================
    401 Bad credentials                         bad_token   queue paused 1 h
    403/429, x-ratelimit-remaining 0            rate_limit  back at the reset
    403/429, retry-after or secondary message   rate_limit  back after retry-after
                                                            or 1 min
    403 otherwise                               fault       err, reported
    404 Not Found, 422 Validation Failed        bad_input   fail:
    500, 502, 503, 504; timeouts, resets        transient   retried with backoff
    ==========================================  ==========  =====================

    A limit met again waits at least twice as long as the last time; a job
    limited after 30 minutes of such waits ends, err (lib.run.api_queue).
    Timeouts: 5 s to connect, 30 s to read.
    """
    handlers = {"github.FetchRepo": fetch_repo, "github.FetchUser": fetch_user}
    return make_api_worker("github", db, client, GitHubClient, handlers, throttle, **{"budgets": BUDGETS, **options})
