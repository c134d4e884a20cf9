from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest

import queues.apollo
from lib.clients import APIError, ApolloClient, AuthError, NotFoundError, RateLimitError, ServerError
from lib.clients.api_errors import BadInputError
from lib.clients.apollo import OUTCOMES
from lib.clients.outcomes import Outcome, table_text

ORGANIZATION = {
    "organization": {
        "id": "5e66b6381e05b4008c8331b8",
        "name": "Apollo.io",
        "primary_domain": "apollo.io",
    }
}


@pytest.fixture
def apollo(make_client: Callable[..., Any], fake_api: Any) -> ApolloClient:
    # Keep the real /api/v1 prefix so the test sees the full documented path.
    return make_client(ApolloClient, base_url=fake_api.url + "/api/v1")


def test_enrich_organization_sends_domain_and_key(apollo: ApolloClient, fake_api: Any, token: str) -> None:
    fake_api.reply(200, ORGANIZATION, {"x-minute-requests-left": "49", "x-rate-limit-minute": "50"})

    assert apollo.enrich_organization("apollo.io") == ORGANIZATION

    request = fake_api.last
    assert (request.method, request.path) == ("GET", "/api/v1/organizations/enrich")
    assert request.query == {"domain": ["apollo.io"]}
    assert request.headers["x-api-key"] == token
    assert "authorization" not in request.headers
    assert request.body == b""


def test_401_is_auth_error(apollo: ApolloClient, fake_api: Any) -> None:
    fake_api.reply(401, {"error": "Invalid access credentials."})
    with pytest.raises(AuthError) as info:
        apollo.enrich_organization("apollo.io")
    # Errors report the API path relative to the base URL.
    assert str(info.value) == "GET /organizations/enrich -> 401: Invalid access credentials."


def test_403_is_an_unusable_key(apollo: ApolloClient, fake_api: Any) -> None:
    """A key without access to the endpoint runs no job of the queue until a
    person changes it: the same outcome as a rejected key."""
    fake_api.reply(403, {"error": "This endpoint is not accessible with this API key"})
    with pytest.raises(AuthError) as info:
        apollo.enrich_organization("apollo.io")
    assert info.value.status == 403


def test_429_uses_retry_after(apollo: ApolloClient, fake_api: Any, now: datetime) -> None:
    fake_api.reply(
        429,
        {"error": "rate limit exceeded"},
        {"retry-after": "12", "x-minute-requests-left": "0"},
    )
    with pytest.raises(RateLimitError) as info:
        apollo.enrich_organization("apollo.io")
    assert info.value.status == 429
    assert info.value.reset_at == now + timedelta(seconds=12)


@pytest.mark.parametrize(
    ("headers", "wait"),
    [
        (
            {"x-minute-requests-left": "0", "x-hourly-requests-left": "50"},
            timedelta(minutes=1),
        ),
        (
            {"x-minute-requests-left": "0", "x-hourly-requests-left": "0"},
            timedelta(hours=1),
        ),
        (
            {"x-minute-requests-left": "5", "x-hourly-requests-left": "5", "x-24-hour-requests-left": "0"},
            timedelta(days=1),
        ),
    ],
)
def test_429_without_retry_after_bounds_wait_by_exhausted_window(
    apollo: ApolloClient,
    fake_api: Any,
    now: datetime,
    headers: dict[str, str],
    wait: timedelta,
) -> None:
    fake_api.reply(429, {"error": "rate limit exceeded"}, headers)
    with pytest.raises(RateLimitError) as info:
        apollo.enrich_organization("apollo.io")
    assert info.value.reset_at == now + wait


def test_429_without_any_hint_has_no_reset(apollo: ApolloClient, fake_api: Any) -> None:
    fake_api.reply(429, {"error": "rate limit exceeded"})
    with pytest.raises(RateLimitError) as info:
        apollo.enrich_organization("apollo.io")
    assert info.value.reset_at is None


def test_500_is_server_error(apollo: ApolloClient, fake_api: Any) -> None:
    fake_api.reply(500, {"error": "internal"})
    with pytest.raises(ServerError):
        apollo.enrich_organization("apollo.io")


RAISED = {
    Outcome.RATE_LIMIT: RateLimitError,
    Outcome.BAD_TOKEN: AuthError,
    Outcome.BAD_INPUT: BadInputError,
    Outcome.TRANSIENT: ServerError,
    Outcome.FAULT: APIError,
}


@pytest.mark.parametrize(("status", "outcome"), sorted(OUTCOMES.items()))
def test_every_status_in_the_table_raises_its_outcomes_error(
    apollo: ApolloClient, fake_api: Any, status: int, outcome: Outcome
) -> None:
    """Each status of the table, answered with Apollo's {"error": "..."} body."""
    fake_api.reply(status, {"error": f"status {status}"})
    with pytest.raises(APIError) as info:
        apollo.enrich_organization("apollo.io")
    expected = NotFoundError if status == 404 else RAISED[outcome]
    assert type(info.value) is expected
    assert (info.value.status, info.value.message) == (status, f"status {status}")


@pytest.mark.parametrize(("status", "expected"), [(418, APIError), (507, ServerError)])
def test_a_status_not_in_the_table_is_a_fault_or_transient(
    apollo: ApolloClient, fake_api: Any, status: int, expected: type
) -> None:
    fake_api.reply(status, {"error": "unlisted"})
    with pytest.raises(APIError) as info:
        apollo.enrich_organization("apollo.io")
    assert type(info.value) is expected


def test_the_queue_docstring_shows_the_table() -> None:
    assert table_text(OUTCOMES) in (queues.apollo.__doc__ or "")
