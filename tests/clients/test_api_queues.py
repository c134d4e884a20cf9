"""The API queues end to end: a real poller, a real database, and a loopback
server speaking the API's contract."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import gevent
import pytest
from conftest import NOW, TOKEN
from gevent.event import Event
from tests_support import make_poller, paused, read_until, wait_for

from lib.clients import AnthropicClient, ApolloClient, GitHubClient, SlackClient
from lib.insert import insert
from lib.job import status as st
from lib.operate import setup_check
from lib.operate.queue_state import pause
from lib.run.queue import AUTH_PREFIX, Queue
from lib.run.runtime import Runtime
from lib.setup.settings import Settings
from lib.store.db import DB
from queues import anthropic, apollo, github, registry, slack

ROOT = Path(__file__).resolve().parents[2]


def _stopped() -> Event:
    event = Event()
    event.set()
    return event


# A stop that is already set: the poller skips its local throttle pause (the
# queue-wide pause is still written), so a test does not sit out a reset.
STOPPED = _stopped()


@pytest.fixture(autouse=True)
def clean(db):
    db.exec("TRUNCATE job_queues, github_repos, apollo_organizations, slack_posts")


def _apollo(db, fake_api, runtime=None, **options):
    client = ApolloClient(TOKEN, base_url=fake_api.url + "/api/v1", now=lambda: NOW)
    return make_poller(apollo.make_worker(db, client, now=lambda: NOW, **options), db, runtime=runtime)


def test_github_repo_is_fetched_and_stored(db, fake_api):
    client = GitHubClient(TOKEN, base_url=fake_api.url, now=lambda: NOW)
    fake_api.reply(200, {"full_name": "octo/hello", "stargazers_count": 7}, {"x-ratelimit-remaining": "4000"})
    insert(db, "github", "github.FetchRepo", {"owner": "octo", "repo": "hello"})
    assert make_poller(github.make_worker(db, client), db).work_once() == "ok: octo/hello"
    assert fake_api.last.path == "/repos/octo/hello"
    assert db.query("SELECT full_name, data->>'stargazers_count' FROM github_repos") == [("octo/hello", "7")]
    # The token's hour holds what GitHub says is gone (1,000 of 5,000, 0.72 s
    # of refill each), in every process: other programs spent it too.
    assert 718.5 < _ahead(db, "github/requests") <= 720  # less the throttle's pause after the job


def _ahead(db, budget: str) -> float:
    """How far the budget's moment is ahead of now, in seconds."""
    return db.query_row("SELECT extract(EPOCH FROM tat - now())::float8 FROM job_rates WHERE key = %s", (budget,))[0]


def test_apollo_follows_what_each_answer_says_is_left_of_the_minute(db, fake_api):
    organization = {"organization": {"id": "o1", "name": "Org", "primary_domain": "d.io"}}
    fake_api.reply(200, organization, {"x-minute-requests-left": "10", "x-hourly-requests-left": "190"})
    insert(db, "apollo", "apollo.EnrichOrganization", {"domain": "d.io"})
    assert _apollo(db, fake_api).work_once().startswith("ok")
    # 990 of 1,000 gone (0.06 s of refill each); the hour is no budget of the queue's.
    assert 58.5 < _ahead(db, "apollo/requests_minute") <= 59.4  # less the throttle's pause


def test_missing_repo_is_a_fail_not_a_fault(db, fake_api, sentry_events):
    client = GitHubClient(TOKEN, base_url=fake_api.url, now=lambda: NOW)
    fake_api.reply(404, {"message": "Not Found"})
    insert(db, "github", "github.FetchRepo", {"owner": "octo", "repo": "gone"})
    assert make_poller(github.make_worker(db, client), db).work_once() == "fail: no repository octo/gone"
    assert sentry_events == []


def test_rate_limit_holds_the_queue_until_the_reset_with_the_job_first_in_line(db, fake_api, sentry_events):
    fake_api.reply(429, {"error": "rate limited"}, {"retry-after": "37"})
    job_id = insert(db, "apollo", "apollo.EnrichOrganization", {"domain": "apollo.io"})
    run_at = db.query_row("SELECT run_at FROM jobs WHERE id = %s", (job_id,))[0]
    result = _apollo(db, fake_api).work_once(stop=STOPPED)  # skip the local 37 s pause
    assert result.startswith("skip: rate limited, resets in 37s: GET /organizations/enrich -> 429")
    assert st.kind(result) is st.Kind.SKIP  # not counted as a fault
    assert sentry_events == []
    row = db.query_row("SELECT status, attempts, max_attempts, run_at, last_error FROM jobs WHERE id = %s", (job_id,))
    # Pending in its place (run_at as it was), and the attempt does not count.
    assert row == ("pending", 1, 2, run_at, result)
    # The queue itself is held back for every process until the reset.
    (wait,) = db.query_row("SELECT extract(EPOCH FROM next_claim_at - now()) FROM job_queues WHERE queue = 'apollo'")
    assert 30 < wait <= 37


def test_a_rate_limit_holds_the_queue_in_every_process_and_its_job_runs_first_after_the_reset(
    db, database_url, fake_api, sentry_events
):
    """Three workers of the apollo queue, each on a pool and group commit of
    its own as three processes are. The first request meets a 429 that resets
    in 2 s: no worker sends another until then, so it is the only 429, and
    the job that met it runs first after the reset, the rest in order."""
    fake_api.reply(429, {"error": "rate limited"}, {"retry-after": "2"})
    for n in range(4):
        fake_api.reply(200, {"organization": {"id": f"o{n}", "name": f"Org {n}", "primary_domain": f"d{n}.io"}})
    for n in range(4):
        insert(db, "apollo", "apollo.EnrichOrganization", {"domain": f"d{n}.io"})
    pools = [DB.connect(database_url, size=2) for _ in range(3)]
    stop = Event()
    loops = [gevent.spawn(_apollo(pool, fake_api, runtime=Runtime.alone(pool)).poll, stop) for pool in pools]
    try:
        wait_for(
            lambda: db.query_row("SELECT count(*) FROM jobs WHERE starts_with(status, 'ok: ')")[0] == 4, timeout=30
        )
    finally:
        stop.set()
        gevent.joinall(loops, timeout=10)
        gevent.killall(loops)
        for pool in pools:
            pool.close()
    asked = [r.query["domain"][0] for r in fake_api.received]
    assert asked == ["d0.io", "d0.io", "d1.io", "d2.io", "d3.io"]
    assert fake_api.received[1].at - fake_api.received[0].at >= 1.9
    assert sentry_events == []


def test_throttles_are_pure_functions():
    limited = st.rate_limited(37, "GET /x -> 429: slow down")
    assert apollo.throttle(limited, None, 0.1) == 37
    assert apollo.throttle("ok", None, 0.1) == pytest.approx(0.3)  # 150 a minute: 0.4 s a job
    assert apollo.throttle("ok", None, 2.0) == 0
    assert apollo.throttle("err: boom", ValueError(), 0.0) == pytest.approx(0.4)
    assert slack.throttle("ok", None, 0.25) == pytest.approx(0.75)
    assert github.throttle("ok", None, 0.0) == pytest.approx(0.72)
    assert anthropic.throttle(st.rate_limited(5, "x"), None, 0.0) == 5
    assert anthropic.throttle("ok", None, 0.0) == 0  # its Rate spaces the jobs, across processes
    assert st.rate_limit_wait("skip: nothing to do") is None


def test_two_401s_in_a_row_pause_the_queue_once_and_report_once(db, fake_api, sentry_events):
    """Two workers each hold a job when the token is rejected: one pause, one event."""
    fake_api.reply(401, {"error": "invalid api key"})
    fake_api.reply(401, {"error": "invalid api key"})
    first = _apollo(db, fake_api, concurrency=2)
    second = _apollo(db, fake_api, concurrency=2, runtime=Runtime.alone(db, worker_id="another-process"))
    insert(db, "apollo", "apollo.EnrichOrganization", {"domain": "a.io"})
    insert(db, "apollo", "apollo.EnrichOrganization", {"domain": "b.io"})
    jobs = [first.claim(slot=0), second.claim(slot=1)]
    assert all(jobs)
    results = [first.run(jobs[0], slot=0, stop=STOPPED), second.run(jobs[1], slot=1, stop=STOPPED)]
    assert all(r.startswith("skip: token rejected, queue paused") for r in results)
    assert len(sentry_events) == 1
    [(queue, reason, until)] = paused(db)
    assert queue == "apollo" and reason.startswith(AUTH_PREFIX)
    assert until == NOW + timedelta(hours=1)
    # Both jobs wait for the pause to end; neither is lost.
    assert db.query("SELECT status FROM jobs") == [("pending",), ("pending",)]


def test_slack_posts_once_even_when_run_again(db, fake_api):
    client = SlackClient(TOKEN, base_url=fake_api.url, now=lambda: NOW)
    fake_api.reply(200, {"ok": True, "channel": "C1", "ts": "1700000000.000100"})
    job_id = insert(db, "slack", "slack.PostMessage", {"channel": "C1", "text": "deployed"}, max_attempts=2)
    worker = make_poller(slack.make_worker(db, client), db)
    assert worker.work_once() == "ok: 1700000000.000100"
    assert fake_api.last.json() == {"channel": "C1", "text": "deployed"}
    # As if the job were rescued and run again: it does not post a second time.
    db.exec("UPDATE jobs SET status = 'pending' WHERE id = %s", (job_id,))
    assert worker.work_once() == "skip: already posted"
    assert len(fake_api.received) == 1


def test_slack_invalid_auth_on_http_200_pauses(db, fake_api, sentry_events):
    client = SlackClient(TOKEN, base_url=fake_api.url, now=lambda: NOW)
    fake_api.reply(200, {"ok": False, "error": "invalid_auth"})
    insert(db, "slack", "slack.PostMessage", {"channel": "C1", "text": "hi"})
    result = make_poller(slack.make_worker(db, client, now=lambda: NOW), db).work_once(stop=STOPPED)
    assert result.startswith("skip: token rejected")
    assert [q for q, _, _ in paused(db)] == ["slack"]
    assert len(sentry_events) == 1


def test_anthropic_answer_is_stored(db, fake_api):
    from lib.clients import AnthropicClient

    client = AnthropicClient(TOKEN, base_url=fake_api.url, now=lambda: NOW)
    fake_api.reply(
        200,
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5",
            "content": [{"type": "text", "text": "Paris."}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 12, "output_tokens": 3},
        },
        {"anthropic-ratelimit-output-tokens-remaining": "7000"},
    )
    insert(db, "anthropic", "anthropic.Ask", {"key": "capital-fr", "prompt": "Capital of France?"})
    assert make_poller(anthropic.make_worker(db, client), db).work_once() == "ok: capital-fr"
    assert fake_api.last.json()["messages"] == [{"role": "user", "content": "Capital of France?"}]
    assert db.query("SELECT answer FROM anthropic_answers WHERE key = 'capital-fr'") == [("Paris.",)]
    # The budgets hold what the answer says: 12 input tokens spent of the
    # 4,000 reserved (0.002 s of refill a token), and 1,000 output tokens
    # gone of 8,000 by the API's count (0.0075 s a token), not the 3 this job spent.
    assert _ahead(db, "anthropic/tokens_in") < 1 and 7.4 < _ahead(db, "anthropic/tokens_out") <= 7.5


def test_anthropic_overloaded_sends_the_job_back(db, fake_api, sentry_events):
    from lib.clients import AnthropicClient

    client = AnthropicClient(TOKEN, base_url=fake_api.url, now=lambda: NOW)
    fake_api.reply(529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    insert(db, "anthropic", "anthropic.Ask", {"key": "k", "prompt": "p"})
    result = make_poller(anthropic.make_worker(db, client, now=lambda: NOW), db).work_once(stop=STOPPED)
    assert result.startswith("skip: rate limited, resets in 60s")
    assert sentry_events == []


def _run_worker(database_url, env, until=lambda: True):
    """The real worker.py with env, stopped by SIGTERM once it runs and until()
    holds: its output."""
    proc = subprocess.Popen(
        [sys.executable, "worker.py"],
        cwd=ROOT,
        env={**env, "DATABASE_URL": database_url},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # The line it logs once every poller is started and its signal handlers are set.
        started = read_until(proc, " queues: ")
        wait_for(until, 30)
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    out = started + rest
    assert proc.returncode == 0, out
    return out


def _without_tokens():
    return {k: v for k, v in os.environ.items() if not k.endswith(("_TOKEN", "_API_KEY"))}


def _definitions(env, db=None) -> dict[str, Queue]:
    """The registry's queues as the worker defines them under env, by name,
    in its order; on db, else on a pool that never connects (the
    constructors only keep it)."""
    queues = setup_check.defined(registry(Settings.from_env(env)), db or setup_check.unconnected())
    return {queue.name: queue for queue in queues}


def _queues_on(env) -> list[str]:
    """The registry's queues that are on under env, in its order (the worker's
    start line): derived, so a queue a user adds does not break the test."""
    return [name for name, queue in _definitions(env).items() if not queue.disabled_reason]


def test_worker_without_tokens_starts_and_says_which_queues_are_off(db, database_url):
    """The real worker.py and registry: no token is set, so the API queues are
    off and said so once; the rest run. Starting also ends an auth pause."""
    pause(db, "caches", AUTH_PREFIX + "left over")
    on = _queues_on(_without_tokens())
    assert "caches" in on and "github" not in on
    out = _run_worker(database_url, _without_tokens(), until=lambda: not paused(db))
    for queue, var in [
        ("github", "GITHUB_TOKEN"),
        ("slack", "SLACK_BOT_TOKEN"),
        ("anthropic", "ANTHROPIC_API_KEY"),
        ("apollo", "APOLLO_API_KEY"),
    ]:
        assert out.count(f"queue={queue} is off: {var} is not set") == 1, out
    assert f"running {len(on)} queues: {', '.join(on)}" in out
    assert "Traceback" not in out
    assert paused(db) == []


BAD_TOKEN = "sekret-TOKEN\n1234"  # pasted with a line break


@pytest.mark.parametrize(
    ("module", "var"),
    [
        (github, "GITHUB_TOKEN"),
        (slack, "SLACK_BOT_TOKEN"),
        (anthropic, "ANTHROPIC_API_KEY"),
        (apollo, "APOLLO_API_KEY"),
    ],
)
def test_a_token_with_a_line_break_turns_its_queue_off(module, var):
    """Not sent with every job to fail each one with the token in its text:
    the queue is off from the start, and the reason names the variable only."""
    queue = _definitions({var: BAD_TOKEN})[module.__name__.split(".")[-1]]
    assert queue.disabled_reason is not None
    assert queue.disabled_reason.startswith(f"{var} holds U+000A")
    assert "sekret" not in queue.disabled_reason and "1234" not in queue.disabled_reason


# Each API queue, its client, and one job it runs.
API_QUEUES = [
    ("github", GitHubClient, "github.FetchUser", {"login": "octocat"}),
    ("slack", SlackClient, "slack.PostMessage", {"channel": "C1", "text": "hi"}),
    ("anthropic", AnthropicClient, "anthropic.Ask", {"key": "k", "prompt": "p"}),
    ("apollo", ApolloClient, "apollo.EnrichOrganization", {"domain": "apollo.io"}),
]


@pytest.mark.parametrize(("queue", "cls", "name", "args"), API_QUEUES, ids=[q[0] for q in API_QUEUES])
def test_the_registry_gives_each_api_queue_its_own_token_and_base_url(db, fake_api, queue, cls, name, args):
    """queues.registry(settings): each queue's client is built from its own
    two settings, the variables its client names (TOKEN_ENV, BASE_URL_ENV);
    the others' tokens go nowhere near it."""
    env = {c.TOKEN_ENV: f"{c.__name__}-token" for _, c, _, _ in API_QUEUES}
    env |= {c.BASE_URL_ENV: "http://127.0.0.1:9" for _, c, _, _ in API_QUEUES}
    env[cls.BASE_URL_ENV] = fake_api.url
    definition = _definitions(env, db)[queue]
    assert (definition.name, definition.disabled_reason) == (queue, None)
    poller = make_poller(definition, db)
    fake_api.reply(500, {"error": "down"})
    insert(db, queue, name, args)
    # A post Slack may have made (its 500 says nothing) or the first try at a transient fault.
    assert poller.work_once(stop=STOPPED).startswith(("err: OutcomeUnknown", "skip: transient fault (try 1 of 5)"))
    sent = " ".join(fake_api.last.headers.values())
    assert [c.__name__ for _, c, _, _ in API_QUEUES if f"{c.__name__}-token" in sent] == [cls.__name__]


def test_worker_says_once_that_a_bad_token_turned_its_queue_off(db, database_url):
    insert(db, "github", "github.FetchRepo", {"owner": "octo", "repo": "hello"})
    out = _run_worker(database_url, {**_without_tokens(), "GITHUB_TOKEN": BAD_TOKEN})
    assert out.count("queue=github is off: GITHUB_TOKEN holds U+000A") == 1, out
    assert "sekret" not in out and "1234" not in out, out
    # The job waits for a fixed token; it was never tried with this one.
    assert db.query("SELECT status, last_error FROM jobs") == [("pending", None)]


@pytest.mark.parametrize("args", [{"owner": "..", "repo": "user"}, {"owner": "octo", "repo": ".."}])
def test_a_path_traversal_in_args_fails_the_job_unsent(db, fake_api, sentry_events, args):
    """('..', 'user') was sent as GET /user with the token, and the token
    owner's profile was stored as a repository. Bad input, not a fault: the
    job fails with the reason, nothing is sent, nothing reported."""
    client = GitHubClient(TOKEN, base_url=fake_api.url, now=lambda: NOW)
    fake_api.reply(200, {"login": "token-owner", "email": "owner@example.com"})  # what GET /user answers
    job_id = insert(db, "github", "github.FetchRepo", args)
    result = make_poller(github.make_worker(db, client), db).work_once()
    assert result.startswith("fail: "), result
    assert "not a GitHub" in result
    assert fake_api.received == []
    assert db.query("SELECT count(*) FROM github_repos") == [(0,)]
    assert db.query("SELECT status FROM jobs WHERE id = %s", (job_id,)) == [(result,)]
    assert sentry_events == []


@pytest.mark.parametrize("retry_after", ["inf", "1e12", "3153600000"])
def test_a_huge_retry_after_holds_the_queue_for_a_day_at_most(db, fake_api, sentry_events, retry_after):
    """inf and 1e12 made the job end err: (an overflow); a century was obeyed."""
    fake_api.reply(429, {"error": "rate limited"}, {"retry-after": retry_after})
    job_id = insert(db, "apollo", "apollo.EnrichOrganization", {"domain": "apollo.io"})
    result = _apollo(db, fake_api).work_once(stop=STOPPED)
    assert result.startswith("skip: rate limited, resets in 86400s"), result
    assert sentry_events == []
    assert db.query_row("SELECT status, run_at <= now() FROM jobs WHERE id = %s", (job_id,)) == ("pending", True)
    (wait,) = db.query_row("SELECT extract(EPOCH FROM next_claim_at - now()) FROM job_queues WHERE queue = 'apollo'")
    assert 86000 < wait <= 86400
