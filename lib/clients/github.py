"""GitHub REST API client (api.github.com, API version 2022-11-28)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import quote

from lib.clients.api_errors import APIError, InvalidArgument, RateLimitError
from lib.clients.base import APIClient
from lib.clients.outcomes import SERVER_ERRORS, Outcome
from lib.clients.resets import parse_epoch, parse_retry_after, reset_by_server_clock

if TYPE_CHECKING:
    import requests

# GitHub's advice when a secondary limit comes without retry-after or
# x-ratelimit-remaining: 0 is to wait at least a minute.
SECONDARY_LIMIT_WAIT = timedelta(minutes=1)

# GitHub's rules for a login (user or organization): letters, digits and
# hyphens, not starting with a hyphen, at most 39 characters. The stricter
# rules for new accounts (no trailing or double hyphen) are not applied, as
# older accounts may predate them; an underscore appears in the logins of
# enterprise managed users (octocat_acme).
LOGIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,38}")
# A repository name: letters, digits, '.', '-' and '_', at most 100
# characters; GitHub refuses '.' and '..' as names.
REPO_NAME = re.compile(r"[A-Za-z0-9._-]{1,100}")


def _login(value: str, what: str) -> str:
    if not isinstance(value, str) or not LOGIN.fullmatch(value):
        raise InvalidArgument(f"{what} {value!r:.80} is not a GitHub login")
    return value


def _repo_name(value: str) -> str:
    if not isinstance(value, str) or not REPO_NAME.fullmatch(value) or value in (".", ".."):
        raise InvalidArgument(f"repo {value!r:.80} is not a GitHub repository name")
    return value


# What each answer means (docs.github.com REST: "Troubleshooting the REST
# API", "Rate limits for the REST API"). A 403 or 429 carrying a rate-limit
# signal is a rate limit whatever this says (see _classify). A plain 403 is a
# fault, not a bad token: the token was accepted but may not reach this
# resource (an organization's SAML, a missing scope); other jobs may still
# succeed, so the queue is not paused, and a person is told.
OUTCOMES: dict[int | tuple[int, str], Outcome] = {
    401: Outcome.BAD_TOKEN,
    403: Outcome.FAULT,
    404: Outcome.BAD_INPUT,
    422: Outcome.BAD_INPUT,
    429: Outcome.RATE_LIMIT,
    **SERVER_ERRORS,
}


class GitHubClient(APIClient):
    """GitHub REST API.

    Rate limits arrive as 403 or 429; they are told apart from a forbidden
    resource by ``x-ratelimit-remaining: 0``, ``retry-after`` or a message
    mentioning the rate limit. The rest follows OUTCOMES. Timeouts: 5 s to
    connect, 30 s to read (one small JSON document a request).
    """

    OUTCOMES = OUTCOMES

    TOKEN_ENV = "GITHUB_TOKEN"
    BASE_URL = "https://api.github.com"
    BASE_URL_ENV = "GITHUB_BASE_URL"
    API_VERSION: ClassVar[str] = "2022-11-28"
    # The queue's budget (queues/github) follows what each answer says is left.
    LIMITS_LEFT: ClassVar[Mapping[str, str]] = {"requests": "x-ratelimit-remaining"}
    # GitHub redirects renamed and transferred repositories, within
    # api.github.com; a redirect to any other host is refused.
    FOLLOW_REDIRECTS = True

    def get_repo(self, owner: str, repo: str) -> dict[str, Any]:
        # Checked by GitHub's rules, which leave nothing to quote; quoted all
        # the same, so a looser rule later cannot open the path.
        owner, repo = _login(owner, "owner"), _repo_name(repo)
        return self._request("GET", f"/repos/{quote(owner, safe='')}/{quote(repo, safe='')}")

    def get_user(self, login: str) -> dict[str, Any]:
        login = _login(login, "login")
        return self._request("GET", f"/users/{quote(login, safe='')}")

    def _headers(self) -> dict[str, str]:
        return {
            **super()._headers(),
            "Authorization": f"Bearer {self._token}",
            "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": self.API_VERSION,
        }

    def _classify(self, response: requests.Response, body: Any, method: str, path: str) -> APIError | None:
        status = response.status_code
        if status in (403, 429):
            headers = response.headers
            message = self._message(body, response)
            retry_after = headers.get("retry-after")
            exhausted = headers.get("x-ratelimit-remaining", "").strip() == "0"
            if status == 429 or retry_after or exhausted or "rate limit" in message.lower():
                now = self._now()
                # Order follows GitHub's guidance: retry-after first, then the
                # primary window's reset, else at least one minute.
                reset_at = parse_retry_after(retry_after, now)
                primary = reset_at is None and exhausted
                if primary:
                    reset = parse_epoch(headers.get("x-ratelimit-reset"))
                    if reset is not None:
                        reset_at = reset_by_server_clock(reset, response, now, SECONDARY_LIMIT_WAIT)
                if reset_at is None:
                    reset_at = now + SECONDARY_LIMIT_WAIT
                # A limit that goes on is waited out exponentially longer, and
                # given up on after a while, as GitHub advises for secondary
                # limits: the queue does that for every limit.
                return RateLimitError(status, method, path, message, reset_at=reset_at)
        return super()._classify(response, body, method, path)
