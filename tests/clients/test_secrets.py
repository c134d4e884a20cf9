"""Secrets stay where they belong: each token goes to its own API, in its own
header, and nowhere else (no other header, job row, log line or Sentry event)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from conftest import NOW
from gevent.event import Event
from tests_support import make_poller

from lib.clients import AnthropicClient, ApolloClient, GitHubClient, SlackClient
from lib.insert import insert
from lib.setup.settings import ENV
from queues import anthropic, apollo, github, slack

SECRET = "sekret-TOKEN-1234"

# Each client, one call, and the one header its token belongs in (as sent).
CLIENTS: list[tuple[type[Any], Callable[[Any], Any], str, str]] = [
    (GitHubClient, lambda c: c.get_user("octocat"), "authorization", f"Bearer {SECRET}"),
    (SlackClient, lambda c: c.post_message("C1", "hi"), "authorization", f"Bearer {SECRET}"),
    (
        AnthropicClient,
        lambda c: c.create_message(model="m", max_tokens=1, messages=[]),
        "x-api-key",
        SECRET,
    ),
    (ApolloClient, lambda c: c.enrich_organization("apollo.io"), "x-api-key", SECRET),
]
IDS = [cls.__name__ for cls, *_ in CLIENTS]

# Already set: the poller skips its local throttle pause after a rate limit or
# a rejected token (the queue-wide pause is still written).
STOPPED = Event()
STOPPED.set()


@pytest.mark.parametrize(("cls", "call", "header", "value"), CLIENTS, ids=IDS)
def test_no_trace_headers_go_to_the_apis(cls, call, header, value, fake_api, sentry_events):
    """sentry-sdk adds sentry-trace and baggage to every outgoing request unless
    told not to: they are no business of a third party."""
    fake_api.reply(200, {"ok": True})
    call(cls(SECRET, base_url=fake_api.url, now=lambda: NOW))
    sent = fake_api.last.headers
    assert "sentry-trace" not in sent and "baggage" not in sent, sent
    assert sent[header] == value


# Each queue end to end: its token variable, where its base URL goes, one job,
# the success its API answers, and the header the token belongs in.
QUEUES = [
    (
        github,
        "GITHUB_TOKEN",
        "GITHUB_BASE_URL",
        "github.FetchRepo",
        {"owner": "octo", "repo": "hello"},
        {"full_name": "octo/hello"},
        "authorization",
        f"Bearer {SECRET}",
    ),
    (
        slack,
        "SLACK_BOT_TOKEN",
        "SLACK_BASE_URL",
        "slack.PostMessage",
        {"channel": "C1", "text": "hi"},
        {"ok": True, "ts": "1.2"},
        "authorization",
        f"Bearer {SECRET}",
    ),
    (
        anthropic,
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_BASE_URL",
        "anthropic.Ask",
        {"key": "k", "prompt": "p"},
        {"model": "m", "content": [{"type": "text", "text": "answer"}], "usage": {}},
        "x-api-key",
        SECRET,
    ),
    (
        apollo,
        "APOLLO_API_KEY",
        "APOLLO_BASE_URL",
        "apollo.EnrichOrganization",
        {"domain": "apollo.io"},
        {"organization": {"name": "Apollo"}},
        "x-api-key",
        SECRET,
    ),
]


@pytest.fixture
def clean(db):
    db.exec("TRUNCATE job_queues, github_repos, apollo_organizations, slack_posts, anthropic_answers")


@pytest.mark.parametrize(
    ("module", "var", "base_var", "name", "args", "ok_body", "header", "value"),
    QUEUES,
    ids=[q[0].__name__.split(".")[-1] for q in QUEUES],
)
def test_the_token_goes_only_to_its_api_in_its_header(
    db, clean, fake_api, sentry_events, caplog, settings_of, module, var, base_var, name, args, ok_body, header, value
):
    """A success, a failure whose body echoes the token (an err: reported to
    Sentry) and a rejection that echoes it (the queue paused, reported once):
    the token is in no other header, no job or queue row, no log line and no
    Sentry event."""
    caplog.set_level(logging.DEBUG)
    settings = settings_of({var: SECRET, base_var: fake_api.url})
    [token] = settings.secrets()
    base_url = next(getattr(settings, f) for f, env in ENV.items() if env == base_var)
    # One try at a transient fault: the 500 is the job's last, an err.
    queue = module.make_worker(db, token=token, base_url=base_url, now=lambda: NOW, transient_attempts=1)
    assert queue.disabled_reason is None
    worker = make_poller(queue, db)
    fake_api.reply(200, ok_body)
    fake_api.reply(500, {"message": f"boom, your token {SECRET} broke us", "error": f"token {SECRET}"})
    fake_api.reply(401, {"message": f"invalid credential {SECRET}", "error": f"invalid {SECRET}"})
    results = []
    for n in range(3):
        # The throttle holds the queue after each job: let the next one go now.
        db.exec("UPDATE job_queues SET next_claim_at = NULL")
        insert(db, worker.queue, name, {**args, "n": n})
        results.append(worker.work_once(stop=STOPPED))

    assert results[0].startswith("ok")
    # Slack's 500 on a post may have posted: OutcomeUnknown; the rest, err.
    assert results[1].startswith("err: OutcomeUnknown" if module is slack else "err: ServerError")
    assert results[2].startswith("skip: token rejected")
    assert len(fake_api.received) == 3
    for request in fake_api.received:
        assert "sentry-trace" not in request.headers and "baggage" not in request.headers
        assert request.headers[header] == value
    rows = db.query("SELECT row_to_json(j)::text FROM jobs j") + db.query(
        "SELECT row_to_json(q)::text FROM job_queues q"
    )
    assert len(rows) == 4  # three jobs, and the pause of their queue
    assert len(sentry_events) == 2  # the fault and the rejected token
    # Every place the token must not be, searched as text; a failure names them all.
    places = {
        "other headers": json.dumps([{k: v for k, v in r.headers.items() if k != header} for r in fake_api.received]),
        "request targets and bodies": repr([(r.target, r.body) for r in fake_api.received]),
        "job and queue rows": json.dumps(rows),
        "log lines": caplog.text,
        "sentry events": json.dumps(sentry_events),
    }
    assert [where for where, text in places.items() if SECRET in text] == []
    # Masked, not dropped: what the API said is still there to read.
    assert "[redacted]" in results[1] and "[redacted]" in caplog.text


def _with_password(url: str, password: str) -> str:
    """url with a password in its userinfo (the test servers trust any)."""
    scheme, rest = url.split("://", 1)
    userinfo, _, hostpart = rest.rpartition("@")
    user = (userinfo or "postgres").split(":", 1)[0]
    return f"{scheme}://{user}:{password}@{hostpart}"


def test_a_real_worker_keeps_every_secret_to_itself(db, database_url, fake_api, tmp_path):
    """The real worker.py, end to end: a database password, a token with a
    line break (its queue is off) and a good token whose API echoes it in a
    failure. None of them is in the worker's output, any job row, any body a
    real Sentry-protocol endpoint received, or any header but the token's own."""
    from sentry_server import SentryServer
    from tests_support import ROOT, wait_for

    db_password, bad_token = "SEKRET-db-9876", "SEKRET-gh-5555\nX-Injected: 1"
    sentry = SentryServer()
    fake_api.reply(500, {"ok": False, "error": f"token {SECRET} rejected by upstream"})
    insert(db, "slack", "slack.PostMessage", {"channel": "C1", "text": "hi"})
    insert(db, "github", "github.FetchRepo", {"owner": "octo", "repo": "hello"})
    env = {k: v for k, v in os.environ.items() if not k.endswith(("_TOKEN", "_API_KEY", "_BASE_URL"))}
    env.update(
        DATABASE_URL=_with_password(database_url, db_password),
        SENTRY_DSN=sentry.dsn,
        SLACK_BOT_TOKEN=SECRET,
        SLACK_BASE_URL=fake_api.url,
        GITHUB_TOKEN=bad_token,
    )
    proc = subprocess.Popen(
        [sys.executable, "worker.py"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        wait_for(lambda: db.query_row("SELECT status FROM jobs WHERE queue = 'slack'")[0].startswith("err:"), 30)
        wait_for(lambda: sentry.events, 10)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
        sentry.close()
    assert proc.returncode == 0, out
    assert "queue=github is off: GITHUB_TOKEN holds U+000A" in out
    rows = " ".join(r[0] for r in db.query("SELECT row_to_json(j)::text FROM jobs j"))
    bodies = b" ".join(sentry.bodies).decode()
    headers = [{k: v for k, v in r.headers.items() if k != "authorization"} for r in fake_api.received]
    leaks = {
        where: [s for s in (SECRET, db_password, "SEKRET-gh-5555") if s in text]
        for where, text in (("output", out), ("rows", rows), ("sentry", bodies), ("headers", json.dumps(headers)))
    }
    assert leaks == {"output": [], "rows": [], "sentry": [], "headers": []}
    assert [r.headers["authorization"] for r in fake_api.received] == [f"Bearer {SECRET}"]
    assert "sentry-trace" not in json.dumps(headers)
