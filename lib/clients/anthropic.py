"""Anthropic Messages API client (api.anthropic.com, anthropic-version 2023-06-01)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from lib.clients.base import (
    APIClient,
    APIError,
    OverloadedError,
    RateLimitError,
    parse_retry_after,
    parse_rfc3339,
)

if TYPE_CHECKING:
    import requests

# The limits Anthropic reports as anthropic-ratelimit-<kind>-{remaining,reset}.
LIMIT_KINDS = ("requests", "tokens", "input-tokens", "output-tokens")


class AnthropicClient(APIClient):
    """Anthropic Messages API.

    401 (authentication_error) is an ``AuthError``. 403 (permission_error)
    means the key is valid but may not use this resource, so it stays a plain
    ``APIError``. 429 is our own quota (``RateLimitError``); 529 is the API
    overloaded for all users (``OverloadedError``).
    """

    TOKEN_ENV = "ANTHROPIC_API_KEY"
    BASE_URL = "https://api.anthropic.com"
    BASE_URL_ENV = "ANTHROPIC_BASE_URL"
    API_VERSION: ClassVar[str] = "2023-06-01"

    def create_message(
        self,
        *,
        model: str,
        max_tokens: int,
        messages: list[dict[str, Any]],
        system: str | None = None,
    ) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": model,
            "max_tokens": max_tokens,
            "messages": messages,
        }
        if system is not None:
            payload["system"] = system
        return self._request("POST", "/v1/messages", json=payload)

    def _headers(self) -> dict[str, str]:
        return {
            **super()._headers(),
            "x-api-key": self._token,
            "anthropic-version": self.API_VERSION,
            "content-type": "application/json",
        }

    def _classify(self, response: requests.Response, body: Any, method: str, path: str) -> APIError | None:
        status = response.status_code
        if status == 529 or _error_type(body) == "overloaded_error":
            message = self._message(body, response)
            reset_at = parse_retry_after(response.headers.get("retry-after"), self._now())
            return OverloadedError(status, method, path, message, reset_at=reset_at)
        if status == 429:
            message = self._message(body, response)
            reset_at = self._rate_limit_reset(response.headers)
            return RateLimitError(status, method, path, message, reset_at=reset_at)
        return super()._classify(response, body, method, path)

    def _rate_limit_reset(self, headers: Mapping[str, str]) -> datetime | None:
        reset_at = parse_retry_after(headers.get("retry-after"), self._now())
        if reset_at is not None:
            return reset_at
        # Without retry-after, wait for the latest reset among the limits that
        # are actually exhausted; the others do not block the next request.
        resets = [
            parse_rfc3339(headers.get(f"anthropic-ratelimit-{kind}-reset"))
            for kind in LIMIT_KINDS
            if headers.get(f"anthropic-ratelimit-{kind}-remaining", "").strip() == "0"
        ]
        return max((r for r in resets if r is not None), default=None)


def _error_type(body: Any) -> str | None:
    if isinstance(body, Mapping) and isinstance(body.get("error"), Mapping):
        kind = body["error"].get("type")
        return kind if isinstance(kind, str) else None
    return None
