"""Slack Web API client (slack.com/api)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lib.clients.base import (
    APIClient,
    APIError,
    AuthError,
    RateLimitError,
    ServerError,
    parse_retry_after,
)

if TYPE_CHECKING:
    import requests

# Slack reports failures as HTTP 200 with {"ok": false, "error": "<code>"}.
# These codes mean the token itself is unusable.
AUTH_ERRORS = frozenset({"invalid_auth", "not_authed", "account_inactive", "token_revoked", "token_expired"})
# Slack's own description of these is a failure on its side.
SERVER_ERRORS = frozenset({"internal_error", "service_unavailable"})


class SlackClient(APIClient):
    """Slack Web API, authenticated with a bot token (xoxb-...)."""

    TOKEN_ENV = "SLACK_BOT_TOKEN"
    BASE_URL = "https://slack.com/api"
    BASE_URL_ENV = "SLACK_BASE_URL"

    def post_message(self, channel: str, text: str) -> dict[str, Any]:
        return self._request("POST", "/chat.postMessage", json={"channel": channel, "text": text})

    def _headers(self) -> dict[str, str]:
        return {
            **super()._headers(),
            "Authorization": f"Bearer {self._token}",
            # Slack flags JSON posts that omit the charset (missing_charset).
            "Content-Type": "application/json; charset=utf-8",
        }

    def _classify(self, response: requests.Response, body: Any, method: str, path: str) -> APIError | None:
        status = response.status_code
        if not 200 <= status < 300:
            return super()._classify(response, body, method, path)
        if not isinstance(body, dict):
            return None  # _request reports the missing JSON body itself.
        if body.get("ok") is True:
            return None
        code = body.get("error")
        if not isinstance(code, str) or not code:
            return APIError(status, method, path, "ok is not true and no error code given")
        if code in AUTH_ERRORS:
            return AuthError(status, method, path, code)
        if code == "ratelimited":
            reset_at = parse_retry_after(response.headers.get("retry-after"), self._now())
            return RateLimitError(status, method, path, code, reset_at=reset_at)
        if code in SERVER_ERRORS:
            return ServerError(status, method, path, code)
        return APIError(status, method, path, code)
