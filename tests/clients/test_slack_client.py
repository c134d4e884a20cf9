from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest

import queues.slack
from lib.clients import APIError, AuthError, RateLimitError, ServerError, SlackClient
from lib.clients.api_errors import BadInputError
from lib.clients.outcomes import Outcome, table_text
from lib.clients.slack import OUTCOMES, SlackCodeError


@pytest.fixture
def slack(make_client: Callable[..., Any]) -> SlackClient:
    return make_client(SlackClient)


def test_post_message_sends_json_with_bearer(slack: SlackClient, fake_api: Any, token: str) -> None:
    reply = {
        "ok": True,
        "channel": "C123",
        "ts": "1503435956.000247",
        "message": {"text": "hello"},
    }
    fake_api.reply(200, reply)

    assert slack.post_message("C123", "hello") == reply

    request = fake_api.last
    assert (request.method, request.path) == ("POST", "/chat.postMessage")
    assert request.headers["authorization"] == f"Bearer {token}"
    assert request.headers["content-type"] == "application/json; charset=utf-8"
    assert request.json() == {"channel": "C123", "text": "hello"}


@pytest.mark.parametrize(
    "code",
    [
        "invalid_auth",
        "not_authed",
        "account_inactive",
        "token_revoked",
        "token_expired",
        "missing_scope",
    ],
)
def test_auth_codes_in_ok_false_are_auth_errors(slack: SlackClient, fake_api: Any, code: str) -> None:
    fake_api.reply(200, {"ok": False, "error": code})
    with pytest.raises(AuthError) as info:
        slack.post_message("C123", "hello")
    assert info.value.status == 200
    assert info.value.message == code


def test_http_429_with_retry_after_is_rate_limit(slack: SlackClient, fake_api: Any, now: datetime) -> None:
    fake_api.reply(429, {"ok": False, "error": "ratelimited"}, {"Retry-After": "30"})
    with pytest.raises(RateLimitError) as info:
        slack.post_message("C123", "hello")
    assert info.value.status == 429
    assert info.value.reset_at == now + timedelta(seconds=30)
    assert info.value.message == "ratelimited"


def test_ok_false_ratelimited_is_rate_limit(slack: SlackClient, fake_api: Any, now: datetime) -> None:
    fake_api.reply(200, {"ok": False, "error": "ratelimited"}, {"Retry-After": "5"})
    with pytest.raises(RateLimitError) as info:
        slack.post_message("C123", "hello")
    assert info.value.reset_at == now + timedelta(seconds=5)


def test_channel_not_found_is_bad_input_not_auth(slack: SlackClient, fake_api: Any) -> None:
    fake_api.reply(200, {"ok": False, "error": "channel_not_found"})
    with pytest.raises(APIError) as info:
        slack.post_message("C404", "hello")
    assert type(info.value) is BadInputError
    assert str(info.value) == "POST /chat.postMessage -> 200: channel_not_found"


def test_ok_false_internal_error_is_server_error(slack: SlackClient, fake_api: Any) -> None:
    fake_api.reply(200, {"ok": False, "error": "internal_error"})
    with pytest.raises(ServerError):
        slack.post_message("C123", "hello")


def test_http_500_is_server_error(slack: SlackClient, fake_api: Any) -> None:
    fake_api.reply(500, "upstream failure", {"Content-Type": "text/plain"})
    with pytest.raises(ServerError) as info:
        slack.post_message("C123", "hello")
    assert info.value.message == "upstream failure"


def test_reply_without_ok_is_api_error(slack: SlackClient, fake_api: Any) -> None:
    fake_api.reply(200, {"channel": "C123"})
    with pytest.raises(APIError) as info:
        slack.post_message("C123", "hello")
    assert type(info.value) is APIError


# The error each outcome of the table is raised as.
RAISED = {
    Outcome.RATE_LIMIT: RateLimitError,
    Outcome.BAD_TOKEN: AuthError,
    Outcome.BAD_INPUT: BadInputError,
    Outcome.TRANSIENT: SlackCodeError,
    Outcome.FAULT: APIError,
}


@pytest.mark.parametrize(("code", "outcome"), sorted(OUTCOMES.items()))
def test_every_code_in_the_table_raises_its_outcomes_error(
    slack: SlackClient, fake_api: Any, code: str, outcome: Outcome
) -> None:
    """Each code api.slack.com/methods/chat.postMessage lists in its "Errors"
    table (and the Web API's common errors it can answer), sent as Slack sends
    them: HTTP 200, {"ok": false, "error": "<code>"}."""
    fake_api.reply(200, {"ok": False, "error": code})
    with pytest.raises(APIError) as info:
        slack.post_message("C123", "hello")
    assert type(info.value) is RAISED[outcome]
    assert info.value.message == code


def test_a_code_not_in_the_table_is_a_fault(slack: SlackClient, fake_api: Any) -> None:
    fake_api.reply(200, {"ok": False, "error": "a_code_slack_adds_later"})
    with pytest.raises(APIError) as info:
        slack.post_message("C123", "hello")
    assert type(info.value) is APIError


def test_the_queue_docstring_shows_the_table() -> None:
    assert table_text(OUTCOMES) in (queues.slack.__doc__ or "")
