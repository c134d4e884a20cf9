"""The apollo queue: enrich organizations by domain through Apollo's API."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from lib import status
from lib.api_queue import make_api_worker, throttle_for
from lib.args import unmarshal_args
from lib.clients import ApolloClient
from lib.clients.base import NotFoundError
from lib.db import DB
from lib.poller import PendingJob, Poller
from lib.sql import Q

# The original service's target; Apollo's plans allow more per minute, and a
# 429 still backs off to the reset.
MAX_JOBS_PER_MINUTE = 150
throttle = throttle_for(MAX_JOBS_PER_MINUTE)


@dataclass
class EnrichOrganizationArgs:
    domain: str


def enrich_organization(db: DB, client: ApolloClient, job: PendingJob) -> str:
    args = unmarshal_args(EnrichOrganizationArgs, job.args)
    try:
        data = client.enrich_organization(args.domain)
    except NotFoundError:
        return status.fail(f"no organization for {args.domain}")
    if not data.get("organization"):
        return status.fail(f"no organization for {args.domain}")
    db.exec(Q.apollo_organization_upsert, {"domain": args.domain, "data": json.dumps(data)})
    return status.ok(args.domain)


def make_worker(db: DB, client: ApolloClient | None = None, **options: Any) -> Poller:
    handlers = {"apollo.EnrichOrganization": enrich_organization}
    return make_api_worker("apollo", db, client, ApolloClient, handlers, throttle, **options)
