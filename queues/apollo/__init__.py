"""The apollo queue: enrich organizations by domain through Apollo's API.

What each HTTP status does to a job (lib.clients.apollo.OUTCOMES):

- rate_limit: 429
- bad_token: 401, 403
- bad_input: 400, 404, 422
- transient: 500, 502, 503, 504

A rate limit snoozes the job until the reset (retry-after, else the longest
exhausted window: x-minute-, x-hourly-, x-24-hour-requests-left), longer
each time it repeats, until 30 minutes in a row end it
(lib.run.api_queue.RATE_LIMIT_BUDGET); an unusable
key pauses the queue for an hour with one report; bad input ends the job
``fail:``; a transient status comes back with backoff, counted
(lib.run.api_queue.TRANSIENT_ATTEMPTS); any other status is a fault: err,
reported.

An enrichment can spend a credit, so a request is sent again only when it
provably did not reach Apollo (connection refused or not made). After a read
timeout or a lost reply the job ends ``err: OutcomeUnknown``, final, with one
report: the credit may be spent, and a retry could spend another.

Timeouts: 5 s to connect, 30 s to read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from lib.clients import ApolloClient
from lib.clients.api_errors import BadInputError, NotFoundError
from lib.job import Budget, PendingJob, status
from lib.job.args import unmarshal_args
from lib.run.api_queue import make_api_worker, throttle_for
from lib.run.queue import Queue
from lib.store.db import DB
from lib.store.sql import Q

# The original service's target, kept by the throttle in each process.
# Apollo's paid plans allow 1,000 enrichments a minute (its free plan 50 a
# minute, 200 an hour and 600 a day): the budget holds the minute across
# every process and follows what each answer says is left
# (x-minute-requests-left), so other programs' requests with the same key
# count too; a 429 (a free plan's hour or day) holds the queue until its reset.
MAX_JOBS_PER_MINUTE = 150
throttle = throttle_for(MAX_JOBS_PER_MINUTE)
BUDGETS = (Budget("requests_minute", 1_000, per=60, most=1),)


@dataclass
class EnrichOrganizationArgs:
    domain: str


def enrich_organization(db: DB, client: ApolloClient, job: PendingJob) -> str:
    args = unmarshal_args(EnrichOrganizationArgs, job.args)
    try:
        data = client.enrich_organization(args.domain)
    except NotFoundError:
        return status.fail(f"no organization for {args.domain}")
    except BadInputError as exc:
        return status.fail(f"{args.domain}: {exc.message}")
    if not data.get("organization"):
        return status.fail(f"no organization for {args.domain}")
    db.exec(Q.apollo_organization_upsert, {"domain": args.domain, "data": json.dumps(data)})
    return status.ok(args.domain)


def make_worker(db: DB, client: ApolloClient | None = None, **options: Any) -> Queue:
    handlers = {"apollo.EnrichOrganization": enrich_organization}
    return make_api_worker("apollo", db, client, ApolloClient, handlers, throttle, **{"budgets": BUDGETS, **options})
