"""Budgets hold across worker processes: three real workers of the anthropic
queue (tests/apps/budget_worker.py: 600 input and 200 output tokens every
2 s) against a fake Messages API on loopback that keeps the same limits as
token buckets, as the real API does, and answers 429 to a request its
bucket cannot pay for. Each job's prompt costs its words in input tokens.
The workers reserve at claim and settle from the answer's usage, so the API
never has to refuse one for the budget; once, the API's input bucket is
emptied from outside (another client of the same key), and that one 429
holds the queue for every process until the reset."""

import json
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests_support import ROOT, wait_for

from lib.insert import Job, insert_many
from lib.store.db import DB

APP = ROOT / "tests" / "apps" / "budget_worker.py"
JOBS = 60
LIMIT_IN, LIMIT_OUT, PER = 600, 200, 2.0
# The request the API answers after its input bucket was emptied from outside.
DRAINED_AT = 20


class Bucket:
    """capacity tokens, refilled continuously at capacity / per a second."""

    def __init__(self, capacity: float, per: float) -> None:
        self.capacity, self.rate = capacity, capacity / per
        self.level, self.at = capacity, time.monotonic()

    def refill(self) -> None:
        now = time.monotonic()
        self.level = min(self.capacity, self.level + (now - self.at) * self.rate)
        self.at = now

    def short(self, n: float) -> float:
        """Seconds until it holds n (0: it does now)."""
        self.refill()
        return max(0.0, (n - self.level) / self.rate)


@dataclass
class Asked:
    at: float
    tokens_in: int
    tokens_out: int
    status: int


class FakeMessages:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.tokens_in, self.tokens_out = Bucket(LIMIT_IN, PER), Bucket(LIMIT_OUT, PER)
        self.asked: list[Asked] = []

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, str], dict[str, Any]]:
        prompt = body["messages"][0]["content"]
        tokens_in = len(prompt.split())
        tokens_out = min(body["max_tokens"], max(1, tokens_in // 3))
        with self.lock:
            if len(self.asked) == DRAINED_AT:
                self.tokens_in.refill()
                self.tokens_in.level = 0.0
            wait = max(self.tokens_in.short(tokens_in), self.tokens_out.short(tokens_out))
            status = 429 if wait > 0 else 200
            self.asked.append(Asked(time.monotonic(), tokens_in, tokens_out, status))
            if status == 429:
                headers = {"retry-after": str(math.ceil(wait)), **self.left()}
                error = {"type": "rate_limit_error", "message": "input tokens per minute exceeded"}
                return 429, headers, {"type": "error", "error": error}
            self.tokens_in.level -= tokens_in
            self.tokens_out.level -= tokens_out
            headers = self.left()
        content = [{"type": "text", "text": "ok " * tokens_out}]
        usage = {"input_tokens": tokens_in, "output_tokens": tokens_out}
        message = {"id": "msg", "type": "message", "role": "assistant", "model": body["model"]}
        return 200, headers, {**message, "content": content, "stop_reason": "end_turn", "usage": usage}

    def left(self) -> dict[str, str]:
        """What is left of each limit, as the API says on every answer."""
        return {
            "anthropic-ratelimit-input-tokens-remaining": str(math.floor(self.tokens_in.level)),
            "anthropic-ratelimit-output-tokens-remaining": str(math.floor(self.tokens_out.level)),
        }


@contextmanager
def serving(api: FakeMessages) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            status, headers, answer = api.answer(body)
            payload = json.dumps(answer).encode()
            self.send_response(status)
            for name, value in {"Content-Type": "application/json", **headers}.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_budgets_hold_across_three_processes_and_one_429_holds_them_all(database_url):
    words = random.Random(7)
    jobs = [
        Job(
            "anthropic",
            "anthropic.Ask",
            {"key": f"k{n}", "prompt": " ".join(["w"] * words.randint(10, 60)), "max_tokens": 20},
        )
        for n in range(JOBS)
    ]
    api = FakeMessages()
    db = DB.connect(database_url, size=2, application_name="budget-test")
    procs: list[subprocess.Popen] = []
    try:
        db.exec("TRUNCATE jobs, job_queues, job_rates, workers, anthropic_answers RESTART IDENTITY CASCADE")
        with db.connection() as conn:
            insert_many(conn, jobs)
        with serving(api) as url:
            env = {
                **os.environ,
                "DATABASE_URL": database_url,
                "JOBS_HTTP_ADDR": "off",
                "LOG_LEVEL": "WARNING",
                "BUDGET_API_URL": url,
                "NO_PROXY": "127.0.0.1",
            }
            procs = [
                subprocess.Popen([sys.executable, str(APP)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                for _ in range(3)
            ]
            done = "SELECT count(*) FROM jobs WHERE starts_with(status, 'ok: ')"
            wait_for(lambda: db.query_row(done)[0] == JOBS, 90, every=0.5, what="every job done")
            ran_by = db.query_row("SELECT count(DISTINCT worker_id) FROM jobs")[0]
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        errors = [proc.stderr.read().decode() for proc in procs if proc.wait(30) != 0]
        db.close()
    assert not errors, errors
    refused = [n for n, a in enumerate(api.asked) if a.status == 429]
    # One 429 in all, the one the outside spending caused: the budgets never
    # sent the API a request it could not pay for.
    assert refused == [DRAINED_AT], refused
    # Held in every process until the reset (1 s): the next request waited.
    assert api.asked[DRAINED_AT + 1].at - api.asked[DRAINED_AT].at >= 0.9
    assert len(api.asked) == JOBS + 1 and ran_by >= 2
    # Not starved by the reservations either: the jobs used most of what the
    # budget allowed over the run (its first bucket and the refill since).
    ok = [a for a in api.asked if a.status == 200]
    seconds = ok[-1].at - ok[0].at
    allowed_in = LIMIT_IN + LIMIT_IN / PER * seconds
    assert sum(a.tokens_in for a in ok) >= 0.4 * allowed_in, (sum(a.tokens_in for a in ok), allowed_in)
