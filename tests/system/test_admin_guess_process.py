"""Guessing the admin page's token is slow for every guesser at once: a real
worker process answers wrong credentials sent side by side (bearer headers,
login forms and forged session cookies) one per penalty, while the correct
token is answered at once; and the guesses are one line in the worker's log,
not one each. The gate's own rules, without a process, are
tests/unit/test_admin_guess_gate.py."""

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import gevent
import requests
from http_support import free_port
from tests_support import ROOT, wait_for

ADMIN_WORKER = ROOT / "tests" / "apps" / "admin_worker.py"
TOKEN = "admin-" + "s3cret" * 4
PENALTY = 0.2
BEARERS, LOGINS, COOKIES = 20, 20, 5
FORGED = "9999999999.00ff." + "0" * 64  # a session's shape, a signature nobody made


@contextmanager
def admin_worker(database_url: str, log: Path) -> Iterator[str]:
    """A worker process serving its admin page on a free loopback port, each
    wrong credential costing PENALTY; the page's base URL."""
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "JOBS_HTTP_ADDR": f"127.0.0.1:{port}",
        "JOBS_ADMIN_TOKEN": TOKEN,
        "ADMIN_PENALTY": str(PENALTY),
        "LOG_LEVEL": "INFO",
        "SENTRY_DSN": "",
    }
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(ADMIN_WORKER)], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        wait_for(lambda: _status(f"http://127.0.0.1:{port}/healthz") == 200, 30)
        yield f"http://127.0.0.1:{port}/admin"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _status(url: str) -> int | None:
    try:
        return requests.get(url, timeout=2).status_code
    except requests.RequestException:
        return None


def test_guesses_side_by_side_take_a_penalty_each_and_the_token_is_answered_at_once(database_url, tmp_path):
    log = tmp_path / "worker.log"
    with admin_worker(database_url, log) as base:
        answered: list[int] = []

        def guess(kind: str, i: int) -> None:
            if kind == "bearer":
                answer = requests.get(f"{base}/", headers={"Authorization": f"Bearer guess-{i}"}, timeout=120)
            elif kind == "login":
                answer = requests.post(f"{base}/login", data={"token": f"guess-{i}"}, timeout=120)
            else:
                answer = requests.get(f"{base}/", cookies={"jobs_admin": FORGED}, allow_redirects=False, timeout=120)
            answered.append(answer.status_code)

        kinds = ["bearer"] * BEARERS + ["login"] * LOGINS + ["cookie"] * COOKIES
        started = time.monotonic()
        sent = [gevent.spawn(guess, kind, i) for i, kind in enumerate(kinds)]
        # The first answer comes a penalty after the first guess arrived: by
        # then the others have been sent and wait their turns.
        wait_for(lambda: answered, 30)
        right = requests.get(f"{base}/", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
        still_waiting = len(kinds) - len(answered)
        gevent.joinall(sent, timeout=len(kinds) * PENALTY + 60, raise_error=True)
        took = time.monotonic() - started

    assert right.status_code == 200 and "<h1>Queues</h1>" in right.text
    assert still_waiting > len(kinds) // 2, "the correct token waited behind the guesses"
    assert sorted(answered) == sorted([401] * BEARERS + [403] * LOGINS + [303] * COOKIES)
    assert took >= len(kinds) * PENALTY * 0.95, f"{len(kinds)} guesses answered in {took:.2f}s"
    told = [line for line in log.read_text().splitlines() if "wrong" in line]
    assert len(told) == 1 and "guess-" not in told[0], told


def test_a_filter_a_real_worker_cannot_read_is_a_bad_filter_answer(database_url, tmp_path):
    """An age out of range, a NUL, bytes that are not UTF-8: each page says
    "bad filter" (400) with no traceback, and the next request is served."""
    with admin_worker(database_url, tmp_path / "worker.log") as base:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        wait_for(lambda: requests.get(f"{base}/jobs", headers=auth, timeout=30).status_code == 200, 30)
        for page, query in (("/jobs", "since=999999d"), ("/failures", "queue=%00"), ("/jobs", "q=%ED%A0%80")):
            answer = requests.get(f"{base}{page}?{query}", headers=auth, timeout=30)
            assert answer.status_code == 400 and "Traceback" not in answer.text, (page, query, answer.text[:300])
        assert requests.get(f"{base}/jobs", headers=auth, timeout=30).status_code == 200
    assert " died: " not in (tmp_path / "worker.log").read_text()
