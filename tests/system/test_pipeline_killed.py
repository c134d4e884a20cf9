"""A pipeline of three queues under SIGKILL: Apollo, then Anthropic, then
Slack, each called by its real client on a loopback server that answers as
the API does (the client tests' contracts) and counts every request it
receives, by lead. A worker is killed at random moments, again and again,
then left to finish.

What holds, and what the test asserts:

- Follow-ups: each lead has exactly one enrich, one summarise and one post
  job, and after every kill each enrich ended ok has exactly one summarise
  and each summarise ended ok exactly one post (then() writes them with the
  outcome).
- Steps (job.step): a step's result is stored as soon as its call returns,
  and a later run of the job reads it back instead of calling again. A call
  whose worker is killed before the step's commit (in flight, or answered
  and not yet stored) is made again by the next run: the store comes after
  the answer, and nothing can make the two one. So a lead's Apollo or
  Anthropic call may repeat. The test asserts each repeat is made by a later
  worker than the call it repeats, after that one was killed; that one kill
  repeats no more of a queue's calls than the queue has slots (one call in
  flight each: a kill that lands while four are in flight repeats four, so
  the repeats can outnumber the kills); and that each job's stored step is
  the answer to its lead's last call, so no call came after the store. It
  prints the counts.
- The post goes through the slack queue's own handler, not a step. A step
  stores its result after fn returns, so a worker killed between Slack's
  answer and the step's commit would post again on the next run: at least
  once. The slack queue marks the post begun (slack_posts, ts NULL) before
  it sends it, and a later run that finds the mark ends the job
  ``err: OutcomeUnknown`` instead of posting: at most once. A worker killed
  after the mark and before the post left leaves a lead that is never
  posted, and says so in its status: that, and not a second post, is the
  price. A worker killed after Slack's answer was recorded leaves a job
  that ends ``skip: already posted``. So the test asserts no lead posted
  twice, each lead whose post job ended ok or found its post recorded
  posted once, and each lead without a post has its post job ended with
  that OutcomeUnknown."""

import bisect
import json
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any
from urllib.parse import parse_qs, urlsplit

import gevent
from tests_support import ROOT, wait_for

from lib.insert import Job, insert_many
from lib.store.db import DB

PIPELINE_WORKER = ROOT / "tests" / "apps" / "pipeline_worker.py"
LEADS = 300
KILLS = 20
SLOTS = 4  # each queue's concurrency (tests/apps/pipeline_worker.py)
# How long each fake API takes to answer: calls are in flight when a kill lands.
LATENCY = 0.01
APOLLO_KEY = "apollo-key-0123456789"
ANTHROPIC_KEY = "sk-ant-key-0123456789"
SLACK_TOKEN = "xoxb-token-0123456789"
UNKNOWN = "err: OutcomeUnknown: an earlier run sent this post and stopped before its answer"
LEAD = re.compile(r"\blead[ -](\d+)\b")


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # lower-cased names
    body: bytes


# What a fake API makes of a request and the number it has of its lead's
# calls (1 for the first): the lead it is about (None: refused), the HTTP
# status and the JSON body of its answer.
Answer = tuple[int | None, int, Any]
Answering = Callable[[Request, Callable[[int], int]], Answer]


class FakeAPI(ThreadingHTTPServer):
    """One API on loopback, in the test process (its threads are greenlets
    there): every request it receives, answered by answer, counted by lead
    at its arrival (as the API bills it, whether or not the caller lives to
    read the answer)."""

    daemon_threads = True

    def __init__(self, answer: Answering) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answer = answer
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self.calls: dict[int, list[float]] = defaultdict(list)
        self.refused: list[str] = []
        # Requests whose sender died before their body was all sent.
        self.cut_short = 0
        self.bodies: dict[int, list[Any]] = defaultdict(list)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A killed worker hangs up mid-answer: expected, not a failure.
        pass


class _Handler(BaseHTTPRequestHandler):
    server: FakeAPI
    # Keep-alive, as the APIs serve: the client's session reuses connections.
    protocol_version = "HTTP/1.1"

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        if len(body) < length:
            # Its sender died between the head and the body: an API carries
            # out no request it has not received whole.
            self.server.cut_short += 1
            self.close_connection = True
            return
        parts = urlsplit(self.path)
        request = Request(
            self.command, parts.path, parse_qs(parts.query), {k.lower(): v for k, v in self.headers.items()}, body
        )
        calls = self.server.calls
        lead, status, answer = self.server.answer(request, lambda lead: len(calls[lead]) + 1)
        if lead is None:
            self.server.refused.append(f"{self.command} {self.path}: {answer}")
        else:
            self.server.calls[lead].append(time.monotonic())
            self.server.bodies[lead].append(json.loads(body) if body else None)
        time.sleep(LATENCY)
        payload = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = _handle

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def serving(answer: Answering) -> Iterator[FakeAPI]:
    api = FakeAPI(answer)
    thread = threading.Thread(target=api.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield api
    finally:
        api.shutdown()
        api.server_close()
        thread.join(timeout=5)


def apollo(request: Request, nth: Callable[[int], int]) -> Answer:
    """Organization Enrichment: GET /api/v1/organizations/enrich?domain=...,
    the key in x-api-key (tests/clients/test_apollo_client.py)."""
    if request.headers.get("x-api-key") != APOLLO_KEY:
        return None, 401, {"error": "Invalid access credentials."}
    domain = request.query.get("domain", [""])[0]
    found = LEAD.fullmatch(domain.removesuffix(".example"))
    if (request.method, request.path) != ("GET", "/api/v1/organizations/enrich") or not found:
        return None, 422, {"error": f"not the enrichment of a lead's domain: {domain!r}"}
    lead = int(found.group(1))
    organization = {"id": f"org-{lead}-{nth(lead)}", "name": f"Org {lead}", "primary_domain": domain}
    return lead, 200, {"organization": organization}


def anthropic(request: Request, nth: Callable[[int], int]) -> Answer:
    """Messages: POST /v1/messages with x-api-key and anthropic-version
    (tests/clients/test_anthropic_client.py)."""
    if request.headers.get("x-api-key") != ANTHROPIC_KEY:
        return None, 401, {"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}
    payload = json.loads(request.body or b"null")
    content = payload["messages"][0]["content"] if isinstance(payload, dict) and payload.get("messages") else ""
    found = LEAD.search(content) if isinstance(content, str) else None
    if (request.method, request.path) != ("POST", "/v1/messages") or not found:
        return None, 400, {"type": "error", "error": {"type": "invalid_request_error", "message": "no lead"}}
    if request.headers.get("anthropic-version") != "2023-06-01" or not payload.get("max_tokens"):
        return None, 400, {"type": "error", "error": {"type": "invalid_request_error", "message": "bad request"}}
    lead = int(found.group(1))
    organization = content.split(", of ", 1)[1].split(",", 1)[0] if ", of " in content else "?"
    message = {
        "id": f"msg_{lead}_{nth(lead)}",
        "type": "message",
        "role": "assistant",
        "model": payload["model"],
        "content": [{"type": "text", "text": f"{organization} is a promising lead."}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 20, "output_tokens": 8},
    }
    return lead, 200, message


def slack(request: Request, nth: Callable[[int], int]) -> Answer:
    """chat.postMessage: POST /api/chat.postMessage, JSON, the bot token as a
    bearer; failures are 200 with ok false (tests/clients/test_slack_client.py)."""
    if request.headers.get("authorization") != f"Bearer {SLACK_TOKEN}":
        return None, 200, {"ok": False, "error": "invalid_auth"}
    if not request.headers.get("content-type", "").startswith("application/json"):
        return None, 200, {"ok": False, "error": "invalid_form_data"}
    payload = json.loads(request.body or b"null")
    text = payload.get("text") if isinstance(payload, dict) else None
    found = LEAD.match(text) if isinstance(text, str) else None
    if (request.method, request.path) != ("POST", "/api/chat.postMessage") or not found:
        return None, 200, {"ok": False, "error": "invalid_arguments"}
    ts = f"{time.time():.6f}"
    return int(found.group(1)), 200, {"ok": True, "channel": payload["channel"], "ts": ts, "message": {"text": text}}


def started(env: dict[str, str], log: IO[str], log_path: Path) -> subprocess.Popen:
    """A worker started, once it listens (and so handles SIGTERM)."""
    proc = subprocess.Popen([sys.executable, str(PIPELINE_WORKER)], env=env, stdout=log, stderr=subprocess.STDOUT)
    wait_for(lambda: "listening for wakeups" in log_path.read_text().split("=== killed")[-1], 30)
    return proc


def leads_of(db: DB, queue: str) -> list[int]:
    return [args["lead"] for (args,) in db.query("SELECT args FROM jobs WHERE queue = %s", (queue,))]


def consistent(db: DB, slack_api: FakeAPI) -> None:
    """Each enrich ended ok has exactly one summarise, each summarise ended
    ok exactly one post, and no follow-up is without its job ended ok; no
    lead is posted twice. One statement reads every queue, so one snapshot:
    a killed worker's backend may still commit its last batch between two."""
    rows = db.query("SELECT queue, status, args FROM jobs")
    for parent, child in (("enrich", "summarise"), ("summarise", "post")):
        children = [a["lead"] for (queue, _, a) in rows if queue == child]
        done = {a["lead"] for (queue, status, a) in rows if queue == parent and status == "ok"}
        twice = sorted(lead for lead, n in Counter(children).items() if n > 1)
        assert not twice, f"leads with more than one {child} job: {twice}"
        assert set(children) <= done, f"{child} jobs of leads whose {parent} has not ended ok: {set(children) - done}"
        assert done <= set(children), f"{parent} jobs ended ok without their {child}: {done - set(children)}"
    assert not {lead: len(calls) for lead, calls in slack_api.calls.items() if len(calls) > 1}, "posted twice"


def unfinished(db: DB) -> int:
    """The jobs pending or started. A follow-up is written with its job's
    outcome, so none left means the pipeline has run to its end."""
    return db.query_row("SELECT count(*) FROM jobs WHERE status IN ('pending', 'started')")[0]


def progress(db: DB, apis: tuple[FakeAPI, ...]) -> int:
    """The requests the APIs have received and the jobs ended, all told: a
    worker at work moves it (a run whose steps are stored calls no API)."""
    (ended,) = db.query_row("SELECT count(*) FROM jobs WHERE status NOT IN ('pending', 'started')")
    return ended + sum(len(calls) for api in apis for calls in api.calls.values()) + sum(len(a.refused) for a in apis)


def started_with_step(db: DB) -> set[tuple[str, int]]:
    """The jobs, by queue and id, started with a step stored: after a kill,
    those it cut between the step's commit and the outcome's."""
    return set(
        db.query("SELECT j.queue, j.id FROM jobs j JOIN job_steps s ON s.job_id = j.id WHERE j.status = 'started'")
    )


def callers(api: FakeAPI, starts: list[float]) -> dict[int, list[int]]:
    """The workers (their indexes in starts) that made each lead's calls. A
    worker's calls arrive after it started and before the next one did: a
    killed worker is gone by then."""
    return {lead: [bisect.bisect_right(starts, at) - 1 for at in calls] for lead, calls in api.calls.items()}


def stepped(db: DB, queue: str, step: str, answer_id: Callable[[Any], str]) -> dict[int, str | None]:
    """The id of the answer each lead's job of queue stored as its step (None: none stored)."""
    rows = db.query(
        "SELECT j.args, s.result FROM jobs j LEFT JOIN job_steps s ON s.job_id = j.id AND s.name = %s"
        " WHERE j.queue = %s",
        (step, queue),
    )
    return {args["lead"]: None if result is None else answer_id(result) for (args, result) in rows}


def last_answers(api: FakeAPI, prefix: str, sep: str) -> dict[int, str]:
    """The id of each lead's last answer from api (apollo's and anthropic's ids)."""
    return {lead: f"{prefix}{sep}{lead}{sep}{len(calls)}" for lead, calls in api.calls.items()}


def differ(found: dict[int, Any], wanted: dict[int, Any]) -> dict[int, tuple[Any, Any]]:
    """The leads on which found and wanted differ, with both values, the first ten."""
    leads = [lead for lead in sorted(found.keys() | wanted.keys()) if found.get(lead) != wanted.get(lead)]
    return {lead: (found.get(lead), wanted.get(lead)) for lead in leads[:10]}


def test_a_pipeline_killed_at_any_moment_calls_each_step_once_and_posts_at_most_once(
    db: DB, database_url: str, tmp_path: Path
) -> None:
    db.exec("TRUNCATE slack_posts")
    insert_many(db, [Job("enrich", "enrich.Lead", {"lead": n}) for n in range(LEADS)])
    rng = random.Random(11)
    log_path = tmp_path / "worker.log"
    with serving(apollo) as apollo_api, serving(anthropic) as anthropic_api, serving(slack) as slack_api:
        apis = (apollo_api, anthropic_api, slack_api)
        env = {
            "PATH": "/usr/bin:/bin",
            "JOBS_HTTP_ADDR": "off",
            "DATABASE_URL": database_url,
            "JOBS_LEASE_SECONDS": "2",
            "APOLLO_API_KEY": APOLLO_KEY,
            "APOLLO_BASE_URL": apollo_api.url + "/api/v1",
            "ANTHROPIC_API_KEY": ANTHROPIC_KEY,
            "ANTHROPIC_BASE_URL": anthropic_api.url,
            "SLACK_BOT_TOKEN": SLACK_TOKEN,
            "SLACK_BASE_URL": slack_api.url + "/api",
        }
        starts: list[float] = []
        cut: set[tuple[str, int]] = set()
        began = time.monotonic()
        with open(log_path, "w") as log:
            while len(starts) < KILLS and unfinished(db):
                starts.append(time.monotonic())
                proc = started(env, log, log_path)
                # Killed at a random moment once it is at work: it may first
                # wait out the leases of the jobs the last kill left started.
                before = progress(db, apis)
                wait_for(
                    lambda before=before: progress(db, apis) > before or not unfinished(db),
                    15,
                    what="the worker at work",
                )
                gevent.sleep(rng.uniform(0, 0.5))
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=10)
                log.write("=== killed\n")
                log.flush()
                cut |= started_with_step(db)
                consistent(db, slack_api)
            kills = len(starts)
            starts.append(time.monotonic())
            proc = started(env, log, log_path)
            try:
                wait_for(lambda: not unfinished(db), 60, what="every job ended after the last kill")
            finally:
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(timeout=30) == 0, log_path.read_text()[-3000:]
        took = time.monotonic() - began

    every = set(range(LEADS))
    apollo_callers, anthropic_callers = callers(apollo_api, starts), callers(anthropic_api, starts)
    # Each call made again, counted by the killed worker whose call it repeats.
    apollo_again = Counter(w for workers in apollo_callers.values() for w in workers[:-1])
    anthropic_again = Counter(w for workers in anthropic_callers.values() for w in workers[:-1])
    posts = {args["lead"]: s for (args, s) in db.query("SELECT args, status FROM jobs WHERE queue = 'post'")}
    posted = set(slack_api.calls)
    ok = {lead for lead, s in posts.items() if s.startswith("ok: ")}
    recorded_before = {lead for lead, s in posts.items() if s == "skip: already posted"}
    unknown = {lead for lead, s in posts.items() if s.startswith(UNKNOWN)}
    print(
        f"\n{kills} kills, {LEADS} leads, {took:.0f}s. Called again: Apollo {apollo_again.total()}"
        f" {dict(sorted(apollo_again.items()))}, Anthropic {anthropic_again.total()}"
        f" {dict(sorted(anthropic_again.items()))} (by killed worker: how many of its calls)."
        f" Cut after the step's commit, so not called again: {dict(Counter(queue for queue, _ in cut))}."
        f" Posted {len(posted)}: {len(ok)} ok, {len(recorded_before)} found recorded,"
        f" {len(posted & unknown)} OutcomeUnknown after the post went out. Never posted (OutcomeUnknown):"
        f" {len(every - posted)}, {slack_api.cut_short} of them cut short on the way."
    )

    assert kills >= 15, f"the leads were all done after {kills} kills"
    consistent(db, slack_api)
    for api in apis:
        assert api.refused == [], api.refused[:5]
    for queue in ("enrich", "summarise", "post"):
        assert sorted(leads_of(db, queue)) == sorted(every), queue
    assert Counter(s for (s,) in db.query("SELECT status FROM jobs WHERE queue <> 'post'")) == {"ok": 2 * LEADS}

    # Each step's API: every lead called, and called again only by a later
    # worker after the one before was killed, no more of one kill's calls
    # than the queue has slots.
    for by_lead, again in ((apollo_callers, apollo_again), (anthropic_callers, anthropic_again)):
        assert set(by_lead) == every
        assert not {lead: w for lead, w in by_lead.items() if w != sorted(set(w))}, "called twice by one worker"
        assert all(worker < kills for worker in again), again
        assert max(again.values(), default=0) <= SLOTS, again
    # Each job stored its step, the answer of its lead's last call: no call came after the store.
    organizations = stepped(db, "enrich", "organization", lambda result: result["organization"]["id"])
    wanted = last_answers(apollo_api, "org", "-")
    assert organizations == wanted, differ(organizations, wanted)
    summaries = stepped(db, "summarise", "summary", lambda result: result["id"])
    wanted = last_answers(anthropic_api, "msg", "_")
    assert summaries == wanted, differ(summaries, wanted)

    # The posts: none twice (consistent); one for each lead whose post job
    # knows it was sent; a lead without one has its job ended OutcomeUnknown.
    assert ok | recorded_before | unknown == every, {
        n: s for n, s in posts.items() if n not in ok | recorded_before | unknown
    }
    assert ok | recorded_before <= posted
    assert every - posted <= unknown
    # What was posted is what the lead's steps stored: its organization, summarised.
    for lead, (body,) in slack_api.bodies.items():
        assert body["text"] == f"lead {lead}: Org {lead} is a promising lead.", body
    (recorded,) = db.query_row("SELECT count(*) FROM slack_posts WHERE ts IS NOT NULL")
    (begun,) = db.query_row("SELECT count(*) FROM slack_posts WHERE ts IS NULL")
    assert (recorded, begun) == (len(ok | recorded_before), len(unknown))
