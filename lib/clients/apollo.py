"""Apollo.io API client (api.apollo.io/api/v1)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from lib.clients.base import APIClient, APIError, RateLimitError, parse_retry_after

if TYPE_CHECKING:
    import requests

# Apollo reports requests left per fixed window but not when a window ends,
# so an exhausted window can only bound the wait by its full length.
WINDOWS = (
    ("x-minute-requests-left", timedelta(minutes=1)),
    ("x-hourly-requests-left", timedelta(hours=1)),
    ("x-daily-requests-left", timedelta(days=1)),
)


class ApolloClient(APIClient):
    """Apollo.io REST API.

    401 is an ``AuthError``. 403 means the key is valid but lacks access to
    the endpoint (keys are scoped per endpoint; some need a master key), so it
    stays a plain ``APIError``.
    """

    TOKEN_ENV = "APOLLO_API_KEY"
    BASE_URL = "https://api.apollo.io/api/v1"
    BASE_URL_ENV = "APOLLO_BASE_URL"

    def enrich_organization(self, domain: str) -> dict[str, Any]:
        """Organization Enrichment; ``domain`` without www. or @ (e.g. apollo.io)."""
        return self._request("GET", "/organizations/enrich", params={"domain": domain})

    def _headers(self) -> dict[str, str]:
        return {
            **super()._headers(),
            "x-api-key": self._token,
            "Accept": "application/json",
            "Cache-Control": "no-cache",
        }

    def _classify(self, response: requests.Response, body: Any, method: str, path: str) -> APIError | None:
        if response.status_code == 429:
            message = self._message(body, response)
            reset_at = self._rate_limit_reset(response.headers)
            return RateLimitError(response.status_code, method, path, message, reset_at=reset_at)
        return super()._classify(response, body, method, path)

    def _rate_limit_reset(self, headers: Mapping[str, str]) -> datetime | None:
        now = self._now()
        reset_at = parse_retry_after(headers.get("retry-after"), now)
        if reset_at is not None:
            return reset_at
        waits = [length for header, length in WINDOWS if headers.get(header, "").strip() == "0"]
        return now + max(waits) if waits else None
