from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from lib.clients import (
    AnthropicClient,
    AuthError,
    BadInputError,
    OverloadedError,
    RateLimitError,
    ServerError,
    limits,
)

MESSAGES = [{"role": "user", "content": "Hello"}]
REPLY = {
    "id": "msg_01",
    "type": "message",
    "role": "assistant",
    "content": [{"type": "text", "text": "Hi!"}],
    "model": "claude-test",
    "stop_reason": "end_turn",
    "usage": {"input_tokens": 8, "output_tokens": 3},
}


def error_body(kind: str, message: str) -> dict[str, Any]:
    return {
        "type": "error",
        "error": {"type": kind, "message": message},
        "request_id": "req_1",
    }


@pytest.fixture
def anthropic(make_client: Callable[..., Any]) -> AnthropicClient:
    return make_client(AnthropicClient)


def test_create_message_sends_documented_request(anthropic: AnthropicClient, fake_api: Any, token: str) -> None:
    fake_api.reply(200, REPLY)

    result = anthropic.create_message(model="claude-test", max_tokens=64, messages=MESSAGES, system="Be brief.")

    assert result == REPLY
    request = fake_api.last
    assert (request.method, request.path) == ("POST", "/v1/messages")
    assert request.headers["x-api-key"] == token
    assert request.headers["anthropic-version"] == "2023-06-01"
    assert request.headers["content-type"] == "application/json"
    assert "authorization" not in request.headers
    assert request.json() == {
        "model": "claude-test",
        "max_tokens": 64,
        "messages": MESSAGES,
        "system": "Be brief.",
    }


def test_system_is_omitted_when_not_given(anthropic: AnthropicClient, fake_api: Any) -> None:
    fake_api.reply(200, REPLY)
    anthropic.create_message(model="claude-test", max_tokens=64, messages=MESSAGES)
    assert "system" not in fake_api.last.json()


def test_401_is_auth_error(anthropic: AnthropicClient, fake_api: Any) -> None:
    fake_api.reply(401, error_body("authentication_error", "invalid x-api-key"))
    with pytest.raises(AuthError) as info:
        anthropic.create_message(model="m", max_tokens=1, messages=MESSAGES)
    assert str(info.value) == "POST /v1/messages -> 401: invalid x-api-key"


def test_403_permission_error_is_a_rejected_key(anthropic: AnthropicClient, fake_api: Any) -> None:
    fake_api.reply(403, error_body("permission_error", "Your API key does not have permission"))
    with pytest.raises(AuthError) as info:
        anthropic.create_message(model="m", max_tokens=1, messages=MESSAGES)
    assert info.value.status == 403


def test_400_carries_api_message(anthropic: AnthropicClient, fake_api: Any) -> None:
    fake_api.reply(400, error_body("invalid_request_error", "max_tokens: field required"))
    with pytest.raises(BadInputError) as info:
        anthropic.create_message(model="m", max_tokens=1, messages=MESSAGES)
    assert info.value.message == "max_tokens: field required"


def test_429_uses_retry_after(anthropic: AnthropicClient, fake_api: Any, now: datetime) -> None:
    fake_api.reply(
        429,
        error_body(
            "rate_limit_error",
            "Number of request tokens has exceeded your per-minute rate limit",
        ),
        {
            "retry-after": "17",
            "anthropic-ratelimit-requests-remaining": "0",
            "anthropic-ratelimit-requests-reset": "2030-01-02T03:09:00Z",
            "anthropic-ratelimit-tokens-remaining": "0",
            "anthropic-ratelimit-tokens-reset": "2030-01-02T03:08:00Z",
        },
    )
    with pytest.raises(RateLimitError) as info:
        anthropic.create_message(model="m", max_tokens=1, messages=MESSAGES)
    assert info.value.status == 429
    assert info.value.reset_at == now + timedelta(seconds=17)


def test_429_without_retry_after_uses_exhausted_limit_resets(anthropic: AnthropicClient, fake_api: Any) -> None:
    fake_api.reply(
        429,
        error_body("rate_limit_error", "rate limited"),
        {
            "anthropic-ratelimit-requests-remaining": "0",
            "anthropic-ratelimit-requests-reset": "2030-01-02T03:05:00Z",
            "anthropic-ratelimit-input-tokens-remaining": "0",
            "anthropic-ratelimit-input-tokens-reset": "2030-01-02T03:06:30Z",
            # Not exhausted, so its later reset must not delay the retry.
            "anthropic-ratelimit-output-tokens-remaining": "900",
            "anthropic-ratelimit-output-tokens-reset": "2030-01-02T03:30:00Z",
        },
    )
    with pytest.raises(RateLimitError) as info:
        anthropic.create_message(model="m", max_tokens=1, messages=MESSAGES)
    assert info.value.reset_at == datetime(2030, 1, 2, 3, 6, 30, tzinfo=UTC)


def test_what_each_answer_says_is_left_of_the_keys_limits_is_given_back(
    anthropic: AnthropicClient, fake_api: Any
) -> None:
    fake_api.reply(
        200,
        REPLY,
        {
            "anthropic-ratelimit-input-tokens-remaining": "29000",
            "anthropic-ratelimit-output-tokens-remaining": "7990",
            "anthropic-ratelimit-requests-remaining": "49",
        },
    )
    with limits.telling({}) as left:
        anthropic.create_message(model="m", max_tokens=1, messages=MESSAGES)
    assert left == {"tokens_in": 29000, "tokens_out": 7990}
    fake_api.reply(
        429,
        error_body("rate_limit_error", "rate limited"),
        {"anthropic-ratelimit-input-tokens-remaining": "0", "anthropic-ratelimit-output-tokens-remaining": "x"},
    )
    with limits.telling({}) as left, pytest.raises(RateLimitError):
        anthropic.create_message(model="m", max_tokens=1, messages=MESSAGES)
    assert left == {"tokens_in": 0}
    # Outside a telling block, nothing is kept.
    fake_api.reply(200, REPLY, {"anthropic-ratelimit-input-tokens-remaining": "5"})
    anthropic.create_message(model="m", max_tokens=1, messages=MESSAGES)
    assert left == {"tokens_in": 0}


def test_529_is_overloaded_server_error(anthropic: AnthropicClient, fake_api: Any, now: datetime) -> None:
    fake_api.reply(529, error_body("overloaded_error", "Overloaded"), {"retry-after": "8"})
    with pytest.raises(OverloadedError) as info:
        anthropic.create_message(model="m", max_tokens=1, messages=MESSAGES)
    assert isinstance(info.value, ServerError)
    assert not isinstance(info.value, RateLimitError)
    assert info.value.status == 529
    assert info.value.reset_at == now + timedelta(seconds=8)
    assert info.value.message == "Overloaded"


def test_529_without_retry_after_has_no_reset(anthropic: AnthropicClient, fake_api: Any) -> None:
    fake_api.reply(529, error_body("overloaded_error", "Overloaded"))
    with pytest.raises(OverloadedError) as info:
        anthropic.create_message(model="m", max_tokens=1, messages=MESSAGES)
    assert info.value.reset_at is None


def test_500_api_error_is_server_error(anthropic: AnthropicClient, fake_api: Any) -> None:
    fake_api.reply(500, error_body("api_error", "Internal server error"))
    with pytest.raises(ServerError) as info:
        anthropic.create_message(model="m", max_tokens=1, messages=MESSAGES)
    assert type(info.value) is ServerError


@pytest.mark.parametrize(
    ("reset", "wait"),
    [("9999-12-31T23:59:59Z", timedelta(days=1)), ("2030-01-01T00:00:00Z", timedelta(0))],
    ids=["far", "past"],
)
def test_limit_reset_is_clamped_to_a_day(
    anthropic: AnthropicClient, fake_api: Any, now: datetime, reset: str, wait: timedelta
) -> None:
    fake_api.reply(
        429,
        error_body("rate_limit_error", "rate limited"),
        {"anthropic-ratelimit-tokens-remaining": "0", "anthropic-ratelimit-tokens-reset": reset},
    )
    with pytest.raises(RateLimitError) as info:
        anthropic.create_message(model="m", max_tokens=1, messages=MESSAGES)
    assert info.value.reset_at == now + wait


def test_overloaded_retry_after_is_clamped_to_a_day(anthropic: AnthropicClient, fake_api: Any, now: datetime) -> None:
    fake_api.reply(529, error_body("overloaded_error", "Overloaded"), {"retry-after": "1e12"})
    with pytest.raises(OverloadedError) as info:
        anthropic.create_message(model="m", max_tokens=1, messages=MESSAGES)
    assert info.value.reset_at == now + timedelta(days=1)
