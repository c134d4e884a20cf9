"""Anthropic Messages API client (api.anthropic.com, anthropic-version 2023-06-01)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from lib.clients.api_errors import APIError, OverloadedError
from lib.clients.base import APIClient
from lib.clients.outcomes import Outcome
from lib.clients.resets import parse_retry_after, parse_rfc3339

if TYPE_CHECKING:
    import requests

# The limits Anthropic reports as anthropic-ratelimit-<kind>-{remaining,reset}.
LIMIT_KINDS = ("requests", "tokens", "input-tokens", "output-tokens")


# What each answer means, by status and error type (docs.anthropic.com,
# "Errors"). 529 is the API overloaded for everyone: held back like a rate
# limit (an uncounted snooze, the queue waiting with it), as slowing down is
# what helps; a 500 or 504 is one request failing, retried and counted.
OUTCOMES: dict[int | tuple[int, str], Outcome] = {
    (400, "invalid_request_error"): Outcome.BAD_INPUT,
    (401, "authentication_error"): Outcome.BAD_TOKEN,
    (403, "permission_error"): Outcome.BAD_TOKEN,
    (404, "not_found_error"): Outcome.BAD_INPUT,
    (413, "request_too_large"): Outcome.BAD_INPUT,
    (429, "rate_limit_error"): Outcome.RATE_LIMIT,
    (500, "api_error"): Outcome.TRANSIENT,
    (504, "timeout_error"): Outcome.TRANSIENT,
    (529, "overloaded_error"): Outcome.RATE_LIMIT,
    400: Outcome.BAD_INPUT,
    401: Outcome.BAD_TOKEN,
    403: Outcome.BAD_TOKEN,
    404: Outcome.BAD_INPUT,
    413: Outcome.BAD_INPUT,
    429: Outcome.RATE_LIMIT,
    529: Outcome.RATE_LIMIT,
}

# The official SDK's read timeout: a long generation is still being written
# (and billed) after 30 s. The queue bounds it by its job timeout.
READ_TIMEOUT = 600.0


class AnthropicClient(APIClient):
    """Anthropic Messages API; what each answer means is OUTCOMES.

    401 and 403 are a key that cannot do the job (``AuthError``); 429 is our
    own quota (``RateLimitError``); 529 is the API overloaded for all users
    (``OverloadedError``). Timeouts: 5 s to connect, READ_TIMEOUT to read.
    A message is a POST that spends credits: sent and unanswered, it is not
    sent again (may_repeat).
    """

    TOKEN_ENV = "ANTHROPIC_API_KEY"
    BASE_URL = "https://api.anthropic.com"
    BASE_URL_ENV = "ANTHROPIC_BASE_URL"
    API_VERSION: ClassVar[str] = "2023-06-01"
    OUTCOMES = OUTCOMES
    TIMEOUT = (5.0, READ_TIMEOUT)
    # The queue's budgets (queues/anthropic) follow what each answer says is left.
    LIMITS_LEFT: ClassVar[Mapping[str, str]] = {
        "tokens_in": "anthropic-ratelimit-input-tokens-remaining",
        "tokens_out": "anthropic-ratelimit-output-tokens-remaining",
    }
    # An error answer creates no message: the official SDK sends a request
    # that got a 5xx again, twice by default.
    ERROR_ANSWER_MEANS_UNDONE = True

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

    def _error_code(self, body: Any) -> str | None:
        return _error_type(body)

    def _error_code(self, body: Any) -> str | None:
        return _error_type(body)

    def _classify(self, response: requests.Response, body: Any, method: str, path: str) -> APIError | None:
        status = response.status_code
        if status == 529 or (_error_type(body) == "overloaded_error" and not 200 <= status < 300):
            # Whatever the status an overloaded_error comes with.
            message = self._message(body, response)
            reset_at = parse_retry_after(response.headers.get("retry-after"), self._now())
            return OverloadedError(status, method, path, message, reset_at=reset_at)
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
