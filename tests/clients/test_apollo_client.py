from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest

from lib.clients import APIError, ApolloClient, AuthError, RateLimitError, ServerError

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


def test_403_is_api_error_not_auth(apollo: ApolloClient, fake_api: Any) -> None:
    fake_api.reply(403, {"error": "This endpoint is not accessible with this API key"})
    with pytest.raises(APIError) as info:
        apollo.enrich_organization("apollo.io")
    assert type(info.value) is APIError
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
        ({"x-daily-requests-left": "0"}, timedelta(days=1)),
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
