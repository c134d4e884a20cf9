"""Each client's outcome table, walked against a loopback server answering as
the API's documentation says: every documented status and code gives the
outcome the table says."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from conftest import NOW

from lib.clients import AnthropicClient, GitHubClient, Outcome, RateLimitError
from lib.clients import anthropic as anthropic_module
from lib.clients import github as github_module

MESSAGES = [{"role": "user", "content": "Hello"}]

# docs.anthropic.com, "Errors": "400 - invalid_request_error: There was an
# issue with the format or content of your request." ... "401 -
# authentication_error", "403 - permission_error", "404 - not_found_error",
# "413 - request_too_large", "429 - rate_limit_error", "500 - api_error",
# "504 - timeout_error", "529 - overloaded_error". The body is
# {"type": "error", "error": {"type": ..., "message": ...}}.
ANTHROPIC_DOCUMENTED = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
ANTHROPIC_EXPECTED = {
    400: Outcome.BAD_INPUT,
    401: Outcome.BAD_TOKEN,
    403: Outcome.BAD_TOKEN,
    404: Outcome.BAD_INPUT,
    413: Outcome.BAD_INPUT,
    429: Outcome.RATE_LIMIT,
    500: Outcome.TRANSIENT,
    504: Outcome.TRANSIENT,
    529: Outcome.RATE_LIMIT,
}


def _raised(call: Any) -> BaseException:
    with pytest.raises(Exception) as info:
        call()
    return info.value


def test_anthropic_table_holds_every_documented_error_with_the_outcome_asked_for() -> None:
    assert {code: anthropic_module.OUTCOMES[(code, kind)] for code, kind in ANTHROPIC_DOCUMENTED.items()} == (
        ANTHROPIC_EXPECTED
    )


@pytest.mark.parametrize("code", sorted(ANTHROPIC_DOCUMENTED))
def test_anthropic_answer_gives_the_tables_outcome(make_client: Any, fake_api: Any, code: int) -> None:
    client = make_client(AnthropicClient)
    kind = ANTHROPIC_DOCUMENTED[code]
    fake_api.reply(code, {"type": "error", "error": {"type": kind, "message": f"the {kind}"}})
    error = _raised(lambda: client.create_message(model="m", max_tokens=1, messages=MESSAGES))
    assert client.outcome(error) is anthropic_module.OUTCOMES[(code, kind)]


# docs.github.com REST, "Troubleshooting the REST API" and "Rate limits for
# the REST API": 401 "Bad credentials"; 403 or 429 with
# x-ratelimit-remaining 0 (primary) or "You have exceeded a secondary rate
# limit" (secondary); 404 "Not Found"; 422 "Validation Failed"; 5xx a server
# error.
GITHUB_ANSWERS = [
    (401, {"message": "Bad credentials"}, {}, Outcome.BAD_TOKEN),
    (403, {"message": "Resource not accessible by integration"}, {}, Outcome.FAULT),
    (
        403,
        {"message": "API rate limit exceeded"},
        {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(int(NOW.timestamp()) + 30)},
        Outcome.RATE_LIMIT,
    ),
    (403, {"message": "You have exceeded a secondary rate limit."}, {}, Outcome.RATE_LIMIT),
    (429, {"message": "You have exceeded a secondary rate limit."}, {"retry-after": "5"}, Outcome.RATE_LIMIT),
    (404, {"message": "Not Found"}, {}, Outcome.BAD_INPUT),
    (422, {"message": "Validation Failed"}, {}, Outcome.BAD_INPUT),
    (500, {"message": "Server Error"}, {}, Outcome.TRANSIENT),
    (502, {"message": "Server Error"}, {}, Outcome.TRANSIENT),
    (503, {"message": "Service Unavailable"}, {}, Outcome.TRANSIENT),
    (504, {"message": "Gateway Timeout"}, {}, Outcome.TRANSIENT),
]


def test_github_table_holds_every_status_the_answers_walk() -> None:
    plain = {status: outcome for status, _, headers, outcome in GITHUB_ANSWERS if not headers and status != 403}
    assert {status: github_module.OUTCOMES[status] for status in plain} == plain
    assert github_module.OUTCOMES[403] is Outcome.FAULT


@pytest.mark.parametrize(("status", "body", "headers", "outcome"), GITHUB_ANSWERS)
def test_github_answer_gives_the_tables_outcome(
    make_client: Any, fake_api: Any, status: int, body: Any, headers: dict[str, str], outcome: Outcome
) -> None:
    client = make_client(GitHubClient)
    fake_api.reply(status, body, headers)
    assert client.outcome(_raised(lambda: client.get_user("octocat"))) is outcome


def test_github_reset_past_by_our_clock_waits_by_githubs_date(make_client: Any, fake_api: Any) -> None:
    """docs.github.com REST, "Rate limits for the REST API": "If the
    x-ratelimit-remaining header is 0, you should not retry your request
    until after the time specified by the x-ratelimit-reset header. The
    x-ratelimit-reset header is in UTC epoch seconds." Our clock 90 s ahead
    of GitHub's made a reset 30 s away by GitHub's clock a 0 s wait."""
    client = make_client(GitHubClient)
    fake_api.date = NOW - timedelta(seconds=90)  # GitHub's clock, in its Date header
    reset = int((NOW - timedelta(seconds=60)).timestamp())
    fake_api.reply(
        403, {"message": "API rate limit exceeded"}, {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(reset)}
    )
    error = _raised(lambda: client.get_user("octocat"))
    assert isinstance(error, RateLimitError)
    assert error.reset_at == NOW + timedelta(seconds=30)


def test_github_reset_past_with_no_date_waits_the_minute(make_client: Any, fake_api: Any) -> None:
    """As above, and "Otherwise, wait for at least one minute before
    retrying" (docs.github.com REST, "Rate limits for the REST API"): a reset
    past by both clocks waits the minute, never 0 s."""
    client = make_client(GitHubClient)
    fake_api.date = NOW
    reset = int((NOW - timedelta(seconds=5)).timestamp())
    fake_api.reply(
        403, {"message": "API rate limit exceeded"}, {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(reset)}
    )
    error = _raised(lambda: client.get_user("octocat"))
    assert isinstance(error, RateLimitError)
    assert error.reset_at == NOW + timedelta(minutes=1)
