"""The slack and apollo queues against their APIs' documented contracts: a
real poller, the test database, and loopback servers that answer as the
documentation says."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import gevent
import pytest
from conftest import NOW, TOKEN
from gevent.event import Event
from tests_support import make_poller, paused

from lib.clients import ApolloClient, Outcome, SlackClient
from lib.clients import slack as slack_client
from lib.clients.api_errors import OutcomeUnknown
from lib.insert import insert
from lib.job import PendingJob
from lib.job import status as st
from lib.run.queue import AUTH_PREFIX
from lib.run.runtime import Runtime
from queues import apollo, slack

POSTMESSAGE_DOC = "api.slack.com/methods/chat.postMessage, Errors table"


def _stopped() -> Event:
    event = Event()
    event.set()
    return event


# Set already: the poller skips its local pause after a rate limit or pause.
STOPPED = _stopped()


@pytest.fixture(autouse=True)
def clean(db: Any) -> None:
    db.exec("TRUNCATE job_queues, apollo_organizations, slack_posts")


def _slack_worker(db: Any, base_url: str, runtime: Any = None, **options: Any) -> Any:
    client = SlackClient(TOKEN, base_url=base_url, now=lambda: NOW, timeout=(2.0, 1.0))
    return make_poller(slack.make_worker(db, client, now=lambda: NOW, **options), db, runtime=runtime)


def _job(db: Any, job_id: int) -> tuple[Any, ...]:
    return db.query_row("SELECT status, attempts, max_attempts, last_error FROM jobs WHERE id = %s", (job_id,))


def test_rate_limited_code_snoozes_the_job_uncounted(db: Any, fake_api: Any, sentry_events: list) -> None:
    """chat.postMessage, Errors table (api.slack.com/methods/chat.postMessage):
    "rate_limited: Application has posted too many messages, read the Rate
    Limit documentation for more information." Sent as HTTP 200 with ok false."""
    fake_api.reply(200, {"ok": False, "error": "rate_limited"})
    job_id = insert(db, "slack", "slack.PostMessage", {"channel": "C1", "text": "deployed"})
    result = _slack_worker(db, fake_api.url).work_once(stop=STOPPED)
    assert result.startswith("skip: rate limited, resets in 60s: POST /chat.postMessage -> 200: rate_limited")
    assert sentry_events == []
    status, attempts, _, _ = _job(db, job_id)
    assert (status, attempts) == ("pending", 1)
    (wait,) = db.query_row("SELECT extract(EPOCH FROM next_claim_at - now()) FROM job_queues WHERE queue = 'slack'")
    assert 50 < wait <= 60


def _again(db: Any, worker: Any) -> str:
    """One more run of the queue's job, its snooze and the throttle's hold over."""
    db.exec("UPDATE jobs SET run_at = now() WHERE status = 'pending'")
    db.exec("UPDATE job_queues SET next_claim_at = NULL")
    return worker.work_once(stop=STOPPED)


def test_a_rate_limit_that_repeats_backs_off_and_ends_after_half_an_hour(
    db: Any, fake_api: Any, sentry_events: list
) -> None:
    """api.slack.com/docs/rate-limits: "Slack returns a HTTP 429 Too Many
    Requests error, and a Retry-After HTTP header containing the number of
    seconds until you can retry." A limit met again and again waited its 30 s
    each time, uncounted, forever. The waits double from the API's own, and a
    job that has waited 30 minutes in a row and is limited once more ends."""
    for _ in range(7):
        fake_api.reply(429, {"ok": False, "error": "ratelimited"}, {"Retry-After": "30"})
    job_id = insert(db, "slack", "slack.PostMessage", {"channel": "C1", "text": "deployed"})
    worker = _slack_worker(db, fake_api.url)
    results = [worker.work_once(stop=STOPPED)] + [_again(db, worker) for _ in range(6)]
    assert [st.rate_limit_wait(r) for r in results[:6]] == [30, 60, 120, 240, 480, 960], results
    assert "try 6, 1890s in a row: POST /chat.postMessage -> 429" in results[5]
    assert results[6].startswith("err: RateLimitError: POST /chat.postMessage -> 429"), results[6]
    assert _job(db, job_id)[0] == results[6]
    assert len(sentry_events) == 1  # the job the limit ended; the waits were not faults


def test_a_first_wait_longer_than_the_budget_is_the_apis_word(db: Any, fake_api: Any, sentry_events: list) -> None:
    """Apollo's spent 24-hour window (x-24-hour-requests-left: 0) waits the
    day though that is past the half hour a job waits in a row; limited
    once more after it, the job ends."""
    for _ in range(2):
        fake_api.reply(429, {"error": "rate limit exceeded"}, {"x-24-hour-requests-left": "0"})
    insert(db, "apollo", "apollo.EnrichOrganization", {"domain": "apollo.io"})
    worker = _apollo_worker(db, fake_api.url)
    assert st.rate_limit_wait(worker.work_once(stop=STOPPED)) == 86400
    assert _again(db, worker).startswith("err: RateLimitError: GET /organizations/enrich -> 429")
    assert len(sentry_events) == 1


def test_a_post_answered_with_a_gateway_timeout_is_not_posted_twice(
    db: Any, fake_api: Any, sentry_events: list
) -> None:
    """RFC 9110, 15.6.5: "The 504 (Gateway Timeout) status code indicates that
    the server, while acting as a gateway or proxy, did not receive a timely
    response from an upstream server it needed to access in order to complete
    the request." The upstream may have posted; an HTTP 5xx was a fault the
    poller retried while attempts remained. It ends OutcomeUnknown, sent once."""
    fake_api.reply(504, "<html>Gateway Timeout</html>", {"Content-Type": "text/html"})
    fake_api.reply(200, {"ok": True, "channel": "C1", "ts": "1700000000.000100"})
    job_id = insert(db, "slack", "slack.PostMessage", {"channel": "C1", "text": "deployed"}, max_attempts=2)
    worker = _slack_worker(db, fake_api.url, retry_base=0.01)
    result = worker.work_once(stop=STOPPED)
    assert result.startswith("err: OutcomeUnknown: the answer says the request may have been carried out"), result
    assert _job(db, job_id)[0] == result
    assert _again(db, worker) is None
    assert len(fake_api.received) == 1
    assert len(sentry_events) == 1


def test_missing_scope_pauses_the_queue_once_with_one_report(db: Any, fake_api: Any, sentry_events: list) -> None:
    """chat.postMessage, Errors table (api.slack.com/methods/chat.postMessage):
    "missing_scope: The token used is not granted the specific scope
    permissions required to complete this request." Two workers each hold a
    job when the answer comes: one pause, one report, both jobs kept."""
    fake_api.reply(200, {"ok": False, "error": "missing_scope"})
    fake_api.reply(200, {"ok": False, "error": "missing_scope"})
    first = _slack_worker(db, fake_api.url, concurrency=2)
    second = _slack_worker(db, fake_api.url, concurrency=2, runtime=Runtime.alone(db, worker_id="another-process"))
    insert(db, "slack", "slack.PostMessage", {"channel": "C1", "text": "a"})
    insert(db, "slack", "slack.PostMessage", {"channel": "C1", "text": "b"})
    jobs = [first.claim(slot=0), second.claim(slot=1)]
    assert all(jobs)
    results = [first.run(jobs[0], slot=0, stop=STOPPED), second.run(jobs[1], slot=1, stop=STOPPED)]
    assert all(r.startswith("skip: token rejected, queue paused") for r in results), results
    assert len(sentry_events) == 1
    [(queue, reason, _until)] = paused(db)
    assert queue == "slack" and reason.startswith(AUTH_PREFIX) and "missing_scope" in reason
    assert db.query("SELECT status FROM jobs") == [("pending",), ("pending",)]


BAD_INPUT = sorted(code for code, o in slack_client.OUTCOMES.items() if o is Outcome.BAD_INPUT)


@pytest.mark.parametrize("code", BAD_INPUT)
def test_bad_input_code_fails_the_job_unreported_and_unretried(
    db: Any, fake_api: Any, sentry_events: list, code: str
) -> None:
    """chat.postMessage, Errors table (api.slack.com/methods/chat.postMessage):
    "channel_not_found: Value passed for channel was invalid.", "not_in_channel:
    Cannot post user messages to a channel they are not in.", "is_archived:
    Channel has been archived.", "msg_too_long: Message text is too long.",
    "no_text: No message text provided.": the same input gets the same answer."""
    fake_api.reply(200, {"ok": False, "error": code})
    job_id = insert(db, "slack", "slack.PostMessage", {"channel": "C1", "text": "deployed"})
    result = _slack_worker(db, fake_api.url).work_once(stop=STOPPED)
    assert result == f"fail: {code}"
    assert _job(db, job_id)[:2] == (result, 1)
    assert sentry_events == []
    assert len(fake_api.received) == 1


@pytest.mark.parametrize("code", ["service_unavailable", "request_timeout"])
def test_transient_code_is_retried_until_it_posts(db: Any, fake_api: Any, code: str) -> None:
    """api.slack.com/methods/chat.postMessage, Errors table: "request_timeout:
    The method was called via a POST request, but the POST data was either
    missing or truncated."; the Web API's common errors: "service_unavailable:
    The service is temporarily unavailable". Neither posted the message, so the
    job comes back, counted (try 1 of 5), and posts."""
    fake_api.reply(200, {"ok": False, "error": code})
    fake_api.reply(200, {"ok": True, "channel": "C1", "ts": "1700000000.000100"})
    job_id = insert(db, "slack", "slack.PostMessage", {"channel": "C1", "text": "deployed"})
    worker = _slack_worker(db, fake_api.url)
    first = worker.work_once(stop=STOPPED)
    assert first.startswith("skip: transient fault (try 1 of 5), again in "), first
    assert first.endswith(f"POST /chat.postMessage -> 200: {code}"), first
    assert _job(db, job_id)[0] == "pending"
    db.exec("UPDATE jobs SET run_at = now() WHERE id = %s", (job_id,))
    db.exec("UPDATE job_queues SET next_claim_at = now() WHERE queue = 'slack'")
    assert worker.work_once(stop=STOPPED) == "ok: 1700000000.000100"
    assert [r.json() for r in fake_api.received] == [{"channel": "C1", "text": "deployed"}] * 2


class SilentAPI:
    """A loopback API that reads each request whole (so, for all the client
    can tell, the API has it and may act on it), records its request line and
    body, and then either closes the connection without a reply or never
    answers."""

    def __init__(self, *, close: bool) -> None:
        self.close = close
        self.received: list[tuple[bytes, bytes]] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.stopped = threading.Event()
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.listener.settimeout(0.05)
        while not self.stopped.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            self.received.append(self._read(conn))
            if self.close:
                conn.close()
            else:
                self.held.append(conn)

    @staticmethod
    def _read(conn: socket.socket) -> tuple[bytes, bytes]:
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        head, body = data.split(b"\r\n\r\n", 1)
        lines = head.split(b"\r\n")
        lengths = [int(line.split(b":", 1)[1]) for line in lines if line.lower().startswith(b"content-length:")]
        while len(body) < sum(lengths):
            body += conn.recv(65536)
        return lines[0], body

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=5)
        for conn in self.held:
            conn.close()
        self.listener.close()


@pytest.fixture(params=["closes before replying", "never answers"])
def silent_api(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[SilentAPI]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    server = SilentAPI(close=request.param == "closes before replying")
    yield server
    server.stop()


def test_a_post_whose_reply_is_lost_is_not_posted_twice(db: Any, silent_api: SilentAPI, sentry_events: list) -> None:
    """The request reached Slack; only its reply is gone. chat.postMessage is
    not idempotent and offers no de-duplication, so the job ends saying the
    outcome is unknown, final though attempts remain, reported once, and is
    not sent again."""
    job_id = insert(db, "slack", "slack.PostMessage", {"channel": "C1", "text": "deployed"}, max_attempts=2)
    worker = _slack_worker(db, silent_api.url, retry_base=0.01)
    result = worker.work_once(stop=STOPPED)
    assert result.startswith("err: OutcomeUnknown: the request was sent and no answer came back"), result
    db.exec("UPDATE jobs SET run_at = now() WHERE id = %s", (job_id,))
    db.exec("UPDATE job_queues SET next_claim_at = now() WHERE queue = 'slack'")
    assert worker.work_once(stop=STOPPED) is None
    assert [(line, json.loads(body)) for line, body in silent_api.received] == [
        (b"POST /chat.postMessage HTTP/1.1", {"channel": "C1", "text": "deployed"})
    ]
    assert _job(db, job_id)[:2] == (result, 1)
    assert len(sentry_events) == 1


def test_a_post_stopped_between_sending_and_its_answer_is_not_posted_again(db: Any, sentry_events: list) -> None:
    """The worker stops (killed, shut down) after Slack has the post and
    before its answer is recorded; the job, run again as a rescue runs it,
    does not post a second time: it ends OutcomeUnknown, naming the channel."""
    server = SilentAPI(close=False)
    try:
        job_id = insert(db, "slack", "slack.PostMessage", {"channel": "C1", "text": "deployed"}, max_attempts=3)
        job = PendingJob(job_id, "slack.PostMessage", {"channel": "C1", "text": "deployed"})
        client = SlackClient(TOKEN, base_url=server.url, now=lambda: NOW, timeout=(2.0, 30.0))
        posting = gevent.spawn(slack.post_message, db, client, job)
        with gevent.Timeout(10):
            while not server.received:
                gevent.sleep(0.01)
        posting.kill()  # GreenletExit, as at a shutdown; a kill leaves the same row
        with pytest.raises(
            OutcomeUnknown, match="an earlier run sent this post and stopped before its answer: check C1"
        ):
            slack.post_message(db, client, job)
        assert len(server.received) == 1
    finally:
        server.stop()


def test_a_post_slack_refused_may_be_sent_again(db: Any, fake_api: Any) -> None:
    """A post Slack answered it did not make leaves no begun post behind:
    the next try posts."""
    fake_api.reply(200, {"ok": False, "error": "service_unavailable"})
    fake_api.reply(200, {"ok": True, "channel": "C1", "ts": "1700000000.000100"})
    job_id = insert(db, "slack", "slack.PostMessage", {"channel": "C1", "text": "deployed"})
    job = PendingJob(job_id, "slack.PostMessage", {"channel": "C1", "text": "deployed"})
    client = SlackClient(TOKEN, base_url=fake_api.url, now=lambda: NOW)
    with pytest.raises(slack_client.SlackCodeError):
        slack.post_message(db, client, job)
    assert slack.post_message(db, client, job) == "ok: 1700000000.000100"
    assert db.query_row("SELECT ts FROM slack_posts WHERE job_id = %s", (job_id,)) == ("1700000000.000100",)


@pytest.mark.parametrize("code", sorted(slack_client.MAY_HAVE_TAKEN_EFFECT))
def test_an_error_that_may_have_posted_is_not_posted_twice(
    db: Any, fake_api: Any, sentry_events: list, code: str
) -> None:
    """chat.postMessage, Errors table (api.slack.com/methods/chat.postMessage):
    "internal_error: The server could not complete your operation(s) without
    encountering an error, likely due to a transient issue on our end. It's
    possible some aspect of the operation succeeded before the error was
    raised." (fatal_error: "... a catastrophic error. It's possible some
    aspect of the operation succeeded ...")."""
    fake_api.reply(200, {"ok": False, "error": code})
    fake_api.reply(200, {"ok": True, "channel": "C1", "ts": "1700000000.000100"})
    job_id = insert(db, "slack", "slack.PostMessage", {"channel": "C1", "text": "deployed"}, max_attempts=2)
    worker = _slack_worker(db, fake_api.url, retry_base=0.01)
    result = worker.work_once(stop=STOPPED)
    assert result.startswith("err: OutcomeUnknown: the answer says the request may have been carried out"), result
    assert code in result
    assert _job(db, job_id)[0] == result
    db.exec("UPDATE jobs SET run_at = now() WHERE id = %s", (job_id,))
    assert worker.work_once(stop=STOPPED) is None
    assert len(fake_api.received) == 1
    assert len(sentry_events) == 1


def test_a_refused_connection_is_retried(db: Any, sentry_events: list) -> None:
    """Connection refused: not a byte of the request left, so nothing can be
    posted, and the job comes back as a transient fault, counted."""
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    job_id = insert(db, "slack", "slack.PostMessage", {"channel": "C1", "text": "deployed"})
    result = _slack_worker(db, f"http://127.0.0.1:{port}", retry_base=0.01).work_once(stop=STOPPED)
    assert result.startswith("skip: transient fault (try 1 of 5)"), result
    assert "ConnectionError" in result
    assert _job(db, job_id)[0] == "pending"


def _apollo_worker(db: Any, base_url: str, runtime: Any = None, **options: Any) -> Any:
    client = ApolloClient(TOKEN, base_url=base_url + "/api/v1", now=lambda: NOW, timeout=(2.0, 1.0))
    return make_poller(apollo.make_worker(db, client, now=lambda: NOW, **options), db, runtime=runtime)


def test_apollo_24_hour_window_header_holds_the_queue_for_a_day(db: Any, fake_api: Any, sentry_events: list) -> None:
    """docs.apollo.io, rate limits: each response carries the requests left in
    each window, x-minute-requests-left, x-hourly-requests-left and
    x-24-hour-requests-left. A 429 whose 24-hour window is spent waits a day."""
    fake_api.reply(
        429,
        {"error": "rate limit exceeded"},
        {"x-minute-requests-left": "40", "x-hourly-requests-left": "300", "x-24-hour-requests-left": "0"},
    )
    job_id = insert(db, "apollo", "apollo.EnrichOrganization", {"domain": "apollo.io"})
    result = _apollo_worker(db, fake_api.url).work_once(stop=STOPPED)
    assert result.startswith("skip: rate limited, resets in 86400s"), result
    assert sentry_events == []
    # The job waits at the head of its queue, and the queue waits the day.
    assert db.query_row("SELECT status, run_at <= now() FROM jobs WHERE id = %s", (job_id,)) == ("pending", True)
    (wait,) = db.query_row("SELECT extract(EPOCH FROM next_claim_at - now()) FROM job_queues WHERE queue = 'apollo'")
    assert 86000 < wait <= 86400


@pytest.mark.parametrize("status", [400, 422])
def test_apollo_bad_input_fails_the_job_unreported(db: Any, fake_api: Any, sentry_events: list, status: int) -> None:
    fake_api.reply(status, {"error": "invalid domain"})
    job_id = insert(db, "apollo", "apollo.EnrichOrganization", {"domain": "not a domain"}, max_attempts=3)
    result = _apollo_worker(db, fake_api.url).work_once(stop=STOPPED)
    assert result == "fail: not a domain: invalid domain"
    assert _job(db, job_id)[:2] == (result, 1)
    assert sentry_events == []


def test_apollo_key_without_access_pauses_the_queue(db: Any, fake_api: Any, sentry_events: list) -> None:
    fake_api.reply(403, {"error": "This endpoint is not accessible with this API key"})
    insert(db, "apollo", "apollo.EnrichOrganization", {"domain": "apollo.io"})
    result = _apollo_worker(db, fake_api.url).work_once(stop=STOPPED)
    assert result.startswith("skip: token rejected, queue paused"), result
    assert [q for q, _, _ in paused(db)] == ["apollo"]
    assert len(sentry_events) == 1


def test_an_enrichment_whose_reply_is_lost_is_not_sent_again(
    db: Any, silent_api: SilentAPI, sentry_events: list
) -> None:
    """The request reached the API and may have spent a credit; with attempts
    left, it ends final and is not sent again."""
    job_id = insert(db, "apollo", "apollo.EnrichOrganization", {"domain": "apollo.io"}, max_attempts=2)
    worker = _apollo_worker(db, silent_api.url, retry_base=0.01)
    result = worker.work_once(stop=STOPPED)
    assert result.startswith("err: OutcomeUnknown: the request was sent and no answer came back"), result
    db.exec("UPDATE jobs SET run_at = now() WHERE id = %s", (job_id,))
    db.exec("UPDATE job_queues SET next_claim_at = now() WHERE queue = 'apollo'")
    assert worker.work_once(stop=STOPPED) is None
    assert [line for line, _ in silent_api.received] == [b"GET /api/v1/organizations/enrich?domain=apollo.io HTTP/1.1"]
    assert len(sentry_events) == 1
