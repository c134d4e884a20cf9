"""Each client's outcome table, walked against a loopback server answering as
the API's documentation says: every documented status and code gives the
outcome the table says."""

from __future__ import annotations

import inspect
import socket
from datetime import timedelta
from typing import Any

import pytest
from conftest import NOW, TOKEN
from gevent.event import Event
from tests_support import make_poller

from lib.clients import AnthropicClient, GitHubClient, Outcome, RateLimitError
from lib.clients import anthropic as anthropic_module
from lib.clients import github as github_module
from lib.insert import insert
from lib.job import status as st
from queues import anthropic, github

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


# The queues, end to end: the real poller, the test database, the loopback API.


@pytest.fixture
def clean(db: Any) -> None:
    db.exec("TRUNCATE job_queues, github_repos, anthropic_answers")


def _again(db: Any, worker: Any) -> str:
    """One more run of the queue's job, its snooze and the throttle's hold over."""
    db.exec("UPDATE jobs SET run_at = now() WHERE status = 'pending'")
    db.exec("UPDATE job_queues SET next_claim_at = NULL")
    return worker.work_once(stop=STOPPED)


def _stopped() -> Event:
    event = Event()
    event.set()
    return event


STOPPED = _stopped()


def _github(db: Any, fake_api: Any) -> Any:
    client = GitHubClient(TOKEN, base_url=fake_api.url, now=lambda: NOW)
    return make_poller(github.make_worker(db, client, now=lambda: NOW), db)


def _anthropic(db: Any, fake_api: Any, **kwargs: Any) -> Any:
    client = AnthropicClient(TOKEN, base_url=fake_api.url, now=lambda: NOW, **kwargs)
    return make_poller(anthropic.make_worker(db, client, now=lambda: NOW), db)


def test_github_502_is_retried_counted_and_reported_once_per_run(
    db: Any, clean: None, fake_api: Any, sentry_events: Any
) -> None:
    """A GitHub 502 Bad Gateway ended the job on its first try, with a report.
    RFC 9110, 15.6.3: "The 502 (Bad Gateway) status code indicates that the
    server, while acting as a gateway or proxy, received an invalid response
    from an inbound server": nothing about the request itself. The job tries
    five times, backing off, with one report for the run of failures; the
    fifth ends it, err, and the run's report stands for it."""
    worker = _github(db, fake_api)
    job_id = insert(db, "github", "github.FetchUser", {"login": "octocat"})
    for _ in range(5):
        fake_api.reply(502, {"message": "Server Error"})
    results = [worker.work_once(stop=STOPPED)] + [_again(db, worker) for _ in range(4)]
    for n, result in enumerate(results[:4], start=1):
        assert result.startswith(f"skip: transient fault (try {n} of 5), again in "), result
    assert results[4].startswith("err: ServerError: GET /users/octocat -> 502")
    assert db.query_row("SELECT status, attempts - max_attempts FROM jobs WHERE id = %s", (job_id,)) == (
        results[4],
        0,
    )
    assert len(sentry_events) == 1


def test_github_transient_backoff_grows_with_jitter(db: Any, clean: None, fake_api: Any) -> None:
    """The waits are lib.store.retry_backoff.backoff of the try, from 10 s: [5, 10), then [10, 20)."""
    worker = _github(db, fake_api)
    insert(db, "github", "github.FetchUser", {"login": "octocat"})
    fake_api.reply(503, {"message": "Service Unavailable"})
    fake_api.reply(503, {"message": "Service Unavailable"})
    waits = [worker.work_once(stop=STOPPED), _again(db, worker)]
    seconds = [int(w.split("again in ")[1].split("s", 1)[0]) for w in waits]
    assert 5 <= seconds[0] <= 10 and 10 <= seconds[1] <= 20, waits


def test_anthropic_500_api_error_honours_retry_after(db: Any, clean: None, fake_api: Any, sentry_events: Any) -> None:
    """docs.anthropic.com, "Errors": "500 - api_error: An unexpected error has
    occurred internal to Anthropic's systems." It ended the job, err, on its
    first try; now it comes back after the retry-after the API sent."""
    worker = _anthropic(db, fake_api)
    job_id = insert(db, "anthropic", "anthropic.Ask", {"key": "k", "prompt": "p"})
    fake_api.reply(
        500,
        {"type": "error", "error": {"type": "api_error", "message": "Internal server error"}},
        {"retry-after": "120"},
    )
    result = worker.work_once(stop=STOPPED)
    assert result.startswith("skip: transient fault (try 1 of 5), again in 120s: POST /v1/messages -> 500")
    assert db.query_row(
        "SELECT status, run_at > now() + interval '100 seconds' FROM jobs WHERE id = %s", (job_id,)
    ) == ("pending", True)
    assert len(sentry_events) == 1


def test_anthropic_504_timeout_error_is_retried(db: Any, clean: None, fake_api: Any) -> None:
    """docs.anthropic.com, "Errors": "504 - timeout_error: The request timed
    out while processing it." Retried, then answered."""
    worker = _anthropic(db, fake_api)
    insert(db, "anthropic", "anthropic.Ask", {"key": "k", "prompt": "p"})
    fake_api.reply(504, {"type": "error", "error": {"type": "timeout_error", "message": "Request timed out"}})
    fake_api.reply(200, {"model": "m", "content": [{"type": "text", "text": "yes"}], "usage": {}})
    assert worker.work_once(stop=STOPPED).startswith("skip: transient fault (try 1 of 5)")
    assert _again(db, worker) == "ok: k"


def test_anthropic_400_invalid_request_error_fails_unreported(
    db: Any, clean: None, fake_api: Any, sentry_events: Any
) -> None:
    """docs.anthropic.com, "Errors": "400 - invalid_request_error: There was
    an issue with the format or content of your request." A retry sends the
    same request: fail:, no report."""
    worker = _anthropic(db, fake_api)
    insert(db, "anthropic", "anthropic.Ask", {"key": "k", "prompt": "p"})
    fake_api.reply(400, {"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: too big"}})
    assert worker.work_once(stop=STOPPED) == "fail: POST /v1/messages -> 400: max_tokens: too big"
    assert sentry_events == []


def test_anthropic_message_sent_and_unanswered_is_not_sent_again(
    db: Any, clean: None, fake_api: Any, sentry_events: Any
) -> None:
    """A POST /v1/messages spends credits: its read timed out, so it may have
    been carried out. It ends, err: OutcomeUnknown, sent once."""
    worker = _anthropic(db, fake_api, timeout=(2.0, 0.3))
    job_id = insert(db, "anthropic", "anthropic.Ask", {"key": "k", "prompt": "p"})
    fake_api.reply(200, {"content": []}, delay=1.0)
    result = worker.work_once(stop=STOPPED)
    assert result.startswith("err: OutcomeUnknown: the request was sent and no answer came back"), result
    assert db.query_row("SELECT status FROM jobs WHERE id = %s", (job_id,)) == (result,)
    assert len(fake_api.received) == 1
    assert len(sentry_events) == 1


def test_anthropic_message_refused_at_connect_is_retried(db: Any, clean: None, sentry_events: Any) -> None:
    """Connection refused: the request never left, so trying again spends nothing twice."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed when the block ends: nothing listens
    client = AnthropicClient(TOKEN, base_url=f"http://127.0.0.1:{port}", now=lambda: NOW)
    insert(db, "anthropic", "anthropic.Ask", {"key": "k", "prompt": "p"})
    result = make_poller(anthropic.make_worker(db, client, now=lambda: NOW), db).work_once(stop=STOPPED)
    assert result.startswith("skip: transient fault (try 1 of 5)"), result
    assert "ConnectionError" in result


def test_github_secondary_limit_backs_off_exponentially_then_ends(
    db: Any, clean: None, fake_api: Any, sentry_events: Any
) -> None:
    """docs.github.com REST, "Rate limits for the REST API": "Otherwise, wait
    for at least one minute before retrying. If your request continues to
    fail due to a secondary rate limit, wait for an exponentially increasing
    amount of time between retries, and throw an error after a specific
    number of retries." Five in a row waited 60 s each, uncounted, forever."""
    worker = _github(db, fake_api)
    insert(db, "github", "github.FetchUser", {"login": "octocat"})
    for _ in range(6):
        fake_api.reply(403, {"message": "You have exceeded a secondary rate limit."})
    results = [worker.work_once(stop=STOPPED)] + [_again(db, worker) for _ in range(5)]
    waits = [st.rate_limit_wait(r) for r in results[:5]]
    assert waits == [60, 120, 240, 480, 960], results
    assert "try 5, 1860s in a row: " in results[4]  # past the 30 minutes a job waits in a row
    assert results[5].startswith("err: RateLimitError: GET /users/octocat -> 403")
    assert len(sentry_events) == 1


def test_anthropic_reads_for_ten_minutes_bounded_by_the_job_timeout(db: Any) -> None:
    """A 30 s read timeout cut long generations off; the SDK's default is 10 minutes."""
    assert AnthropicClient(TOKEN).timeout == (5.0, 600.0)
    assert _client_of(anthropic.make_worker(db, token=TOKEN)).timeout == (5.0, 600.0)
    assert _client_of(anthropic.make_worker(db, token=TOKEN, job_timeout=120)).timeout == (5.0, 120.0)
    assert GitHubClient(TOKEN).timeout == (5.0, 30.0)


def _client_of(queue: Any) -> Any:
    """The client the queue's handler calls, from the handler's closure."""
    [handler] = queue.dispatch.values()
    return inspect.getclosurevars(handler).nonlocals["policy"].client


@pytest.mark.parametrize("key", list(anthropic_module.OUTCOMES), ids=str)
def test_every_anthropic_table_entry_is_the_outcome_of_its_answer(make_client: Any, fake_api: Any, key: Any) -> None:
    status, kind = key if isinstance(key, tuple) else (key, "some_new_error")
    client = make_client(AnthropicClient)
    fake_api.reply(status, {"type": "error", "error": {"type": kind, "message": "m"}})
    error = _raised(lambda: client.create_message(model="m", max_tokens=1, messages=MESSAGES))
    assert client.outcome(error) is anthropic_module.OUTCOMES[key]


@pytest.mark.parametrize("status", list(github_module.OUTCOMES))
def test_every_github_table_entry_is_the_outcome_of_its_answer(make_client: Any, fake_api: Any, status: int) -> None:
    client = make_client(GitHubClient)
    fake_api.reply(status, {"message": "m"})
    assert client.outcome(_raised(lambda: client.get_user("octocat"))) is github_module.OUTCOMES[status]
