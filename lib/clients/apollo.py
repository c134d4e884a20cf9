"""Apollo.io API client (api.apollo.io/api/v1).

``OUTCOMES`` says what each HTTP status Apollo documents means to a job;
``_classify`` raises from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from lib.clients.base import APIClient
from lib.clients.outcomes import SERVER_ERRORS, Outcome, OutcomeTable
from lib.clients.resets import parse_retry_after

if TYPE_CHECKING:
    pass

# Apollo reports requests left per fixed window but not when a window ends,
# so an exhausted window can only bound the wait by its full length. The
# names are the ones docs.apollo.io gives (x-24-hour-, not x-daily-).
WINDOWS = (
    ("x-minute-requests-left", timedelta(minutes=1)),
    ("x-hourly-requests-left", timedelta(hours=1)),
    ("x-24-hour-requests-left", timedelta(days=1)),
)

OUTCOMES: OutcomeTable = {
    400: Outcome.BAD_INPUT,
    401: Outcome.BAD_TOKEN,
    # Keys are scoped per endpoint (some need a master key): a key refused
    # here cannot run any job of the queue until a person changes it.
    403: Outcome.BAD_TOKEN,
    404: Outcome.BAD_INPUT,
    422: Outcome.BAD_INPUT,
    429: Outcome.RATE_LIMIT,
    **SERVER_ERRORS,
}


class ApolloClient(APIClient):
    """Apollo.io REST API; what each status raises is OUTCOMES. Timeouts: 5 s
    to connect, 30 s to read."""

    OUTCOMES = OUTCOMES
    # An enrichment can spend a credit, GET though it is: a request that got
    # no answer may have spent one, and is not sent again.
    REPEATABLE_METHODS = frozenset()
    # An error answer carries no enrichment: only a lost reply leaves the
    # credit in doubt, so a 5xx is retried.
    ERROR_ANSWER_MEANS_UNDONE = True

    TOKEN_ENV = "APOLLO_API_KEY"
    BASE_URL = "https://api.apollo.io/api/v1"
    BASE_URL_ENV = "APOLLO_BASE_URL"
    # The queue's budgets (queues/apollo) follow what each answer says is left.
    LIMITS_LEFT: ClassVar[Mapping[str, str]] = {"requests_minute": "x-minute-requests-left"}

    def enrich_organization(self, domain: str) -> dict[str, Any]:
        """Organization Enrichment; ``domain`` without www. or @ (e.g. apollo.io).
        Each call can spend an enrichment credit."""
        return self._request("GET", "/organizations/enrich", params={"domain": domain})

    def _headers(self) -> dict[str, str]:
        return {
            **super()._headers(),
            "x-api-key": self._token,
            "Accept": "application/json",
            "Cache-Control": "no-cache",
        }

    def _rate_limit_reset(self, headers: Mapping[str, str]) -> datetime | None:
        now = self._now()
        reset_at = parse_retry_after(headers.get("retry-after"), now)
        if reset_at is not None:
            return reset_at
        waits = [length for header, length in WINDOWS if headers.get(header, "").strip() == "0"]
        return now + max(waits) if waits else None
