from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from lib.clients import (
    APIError,
    AuthError,
    GitHubClient,
    NotFoundError,
    RateLimitError,
    ServerError,
)

RESET_EPOCH = "1893553800"  # 2030-01-02T03:10:00Z, after the tests' NOW
RESET_AT = datetime(2030, 1, 2, 3, 10, tzinfo=UTC)


@pytest.fixture
def github(make_client: Callable[..., Any]) -> GitHubClient:
    return make_client(GitHubClient)


def test_get_repo_sends_documented_headers(github: GitHubClient, fake_api: Any, token: str) -> None:
    repo = {"id": 1, "full_name": "octo/hello", "private": False}
    fake_api.reply(200, repo)

    assert github.get_repo("octo", "hello") == repo

    request = fake_api.last
    assert (request.method, request.path) == ("GET", "/repos/octo/hello")
    assert request.headers["authorization"] == f"Bearer {token}"
    assert request.headers["accept"] == "application/vnd.github+json"
    assert request.headers["x-github-api-version"] == "2022-11-28"
    assert request.headers["user-agent"] == "jobs-worker"


def test_get_user_sends_the_login(github: GitHubClient, fake_api: Any) -> None:
    fake_api.reply(200, {"login": "octocat", "id": 583231})
    assert github.get_user("octocat") == {"login": "octocat", "id": 583231}
    assert fake_api.last.path == "/users/octocat"


GOOD_NAMES = [
    ("octo-cat", "hello"),
    ("a", ".github"),
    ("A1", "my_repo.js"),
    ("x" * 39, "y" * 100),
    ("octo_acme", "-x-"),
]


@pytest.mark.parametrize(("owner", "repo"), GOOD_NAMES)
def test_names_github_allows_are_sent(github: GitHubClient, fake_api: Any, owner: str, repo: str) -> None:
    fake_api.reply(200, {"full_name": f"{owner}/{repo}"})
    github.get_repo(owner, repo)
    assert fake_api.last.path == f"/repos/{owner}/{repo}"


BAD_LOGINS = ["..", ".", "", "a/b", "-octo", "octo.cat", "x" * 40, "octo cat", "octo\n", "%2e%2e", "octo?x", "ö"]
BAD_REPOS = ["..", ".", "", "a/b", "x" * 101, "a b", "a\\b", "%2e%2e", "a?b", "a#b"]


@pytest.mark.parametrize("login", BAD_LOGINS)
def test_a_login_github_would_not_issue_is_refused_unsent(github: GitHubClient, fake_api: Any, login: str) -> None:
    """('..', 'user') became GET /user: the token owner's own profile."""
    with pytest.raises(ValueError, match="not a GitHub login") as info:
        github.get_user(login)
    assert type(info.value).__name__ == "InvalidArgument"
    with pytest.raises(ValueError, match="not a GitHub login"):
        github.get_repo(login, "user")
    assert fake_api.received == []


@pytest.mark.parametrize("repo", BAD_REPOS)
def test_a_repo_name_github_would_not_allow_is_refused_unsent(github: GitHubClient, fake_api: Any, repo: str) -> None:
    with pytest.raises(ValueError, match="not a GitHub repository name"):
        github.get_repo("octo", repo)
    assert fake_api.received == []


def test_401_is_auth_error(github: GitHubClient, fake_api: Any) -> None:
    fake_api.reply(401, {"message": "Bad credentials", "status": "401"})
    with pytest.raises(AuthError) as info:
        github.get_repo("octo", "hello")
    assert str(info.value) == "GET /repos/octo/hello -> 401: Bad credentials"


@pytest.mark.parametrize("status", [403, 429])
def test_primary_rate_limit_uses_reset_epoch(github: GitHubClient, fake_api: Any, status: int) -> None:
    fake_api.reply(
        status,
        {"message": "API rate limit exceeded for user ID 1."},
        {
            "x-ratelimit-remaining": "0",
            "x-ratelimit-reset": RESET_EPOCH,
            "x-ratelimit-limit": "5000",
        },
    )
    with pytest.raises(RateLimitError) as info:
        github.get_repo("octo", "hello")
    assert not isinstance(info.value, AuthError)
    assert info.value.status == status
    assert info.value.reset_at == RESET_AT


@pytest.mark.parametrize("status", [403, 429])
def test_secondary_rate_limit_uses_retry_after(github: GitHubClient, fake_api: Any, now: datetime, status: int) -> None:
    fake_api.reply(
        status,
        {"message": "You have exceeded a secondary rate limit."},
        {
            "retry-after": "45",
            "x-ratelimit-remaining": "4000",
            "x-ratelimit-reset": RESET_EPOCH,
        },
    )
    with pytest.raises(RateLimitError) as info:
        github.get_user("octocat")
    assert info.value.reset_at == now + timedelta(seconds=45)


def test_secondary_rate_limit_without_headers_waits_a_minute(
    github: GitHubClient, fake_api: Any, now: datetime
) -> None:
    fake_api.reply(403, {"message": "You have exceeded a secondary rate limit."})
    with pytest.raises(RateLimitError) as info:
        github.get_user("octocat")
    assert info.value.reset_at == now + timedelta(minutes=1)


def test_plain_403_is_api_error_not_auth_or_rate_limit(github: GitHubClient, fake_api: Any) -> None:
    fake_api.reply(
        403,
        {"message": "Resource not accessible by personal access token"},
        {"x-ratelimit-remaining": "4990", "x-ratelimit-reset": RESET_EPOCH},
    )
    with pytest.raises(APIError) as info:
        github.get_repo("octo", "private")
    assert type(info.value) is APIError
    assert info.value.status == 403
    assert info.value.message == "Resource not accessible by personal access token"


def test_404_is_not_found(github: GitHubClient, fake_api: Any) -> None:
    fake_api.reply(
        404,
        {"message": "Not Found", "documentation_url": "https://docs.github.com/rest"},
    )
    with pytest.raises(NotFoundError) as info:
        github.get_repo("a", "b")
    assert str(info.value) == "GET /repos/a/b -> 404: Not Found"


@pytest.mark.parametrize("status", [500, 502, 503])
def test_5xx_is_server_error(github: GitHubClient, fake_api: Any, status: int) -> None:
    fake_api.reply(status, {"message": "Server Error"})
    with pytest.raises(ServerError) as info:
        github.get_user("octocat")
    assert info.value.status == status


@pytest.mark.parametrize(
    ("epoch", "wait"),
    [("99999999999", timedelta(days=1)), ("1893553000", timedelta(minutes=1)), ("1e300", timedelta(minutes=1))],
    ids=["year-5138", "past-by-both-clocks-so-the-minimum", "no-date-so-the-default"],
)
def test_reset_epoch_is_clamped_to_a_day(
    github: GitHubClient, fake_api: Any, now: datetime, epoch: str, wait: timedelta
) -> None:
    fake_api.date = now  # the API's clock agrees with ours
    fake_api.reply(
        403, {"message": "API rate limit exceeded"}, {"x-ratelimit-remaining": "0", "x-ratelimit-reset": epoch}
    )
    with pytest.raises(RateLimitError) as info:
        github.get_user("octocat")
    assert info.value.reset_at == now + wait
