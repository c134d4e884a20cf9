"""The walk of one job, as ARCHITECTURE.md tells it, held to what the real
worker does: a job enqueued to an idle queue of a running worker is traced
from the wakeup to its stored outcome, and the files control passes through
must be the walk's table, move for move.

A move is a call from a function of one file of the project into a function
of another. Not moves: leaving a with-block (`__exit__` ends what
`__enter__` began), a greenlet's start (its first frame has no caller in the
project), and what the pool (lib/store/db.py and the modules it is built
from) does inside a statement: it is the driver, as a library's would be.
Only the greenlets that carry the job are traced: the listener's, the slot's
and the group commit's sender; the worker's other parts (the rescue, the
clock) run beside the walk, not in it."""

from __future__ import annotations

import io
import logging
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import gevent
from tests_support import ROOT, running_worker, wait_for

from lib.http import metrics
from lib.insert import insert
from lib.run.queue import Queue
from lib.setup import counters, logs

HERE = Path(__file__).resolve()
ARCHITECTURE = ROOT / "ARCHITECTURE.md"
# The pool: the driver of the walk, not traced inside.
POOL = {"lib/store/db.py", "lib/store/pool_connections.py", "lib/store/binding.py"}
# The functions at the root of the greenlets that carry a job.
CARRIERS = {"Listener.run", "Poller.run_slot", "_Sender._run"}
# The queue's handler, as the walk names it (here one of this file's).
HANDLER = "queues/<queue>/__init__.py"
MOST_MOVES = 20

Move = tuple[str, str, str]  # (from file, to file, function entered)


def handler(job: Any) -> str:
    return "ok"


def _file(frame: FrameType) -> str | None:
    """The frame's file as the walk names it; None outside the project (the
    standard library, gevent, psycopg2 in any virtualenv, and the test's own
    code)."""
    path = frame.f_code.co_filename
    if path == str(HERE):
        return HANDLER if frame.f_code.co_name == "handler" else None
    if not path.startswith(str(ROOT)) or "/tests/" in path or "/site-packages/" in path:
        return None
    return path[len(str(ROOT)) + 1 :]


class Tracer:
    """sys.setprofile's function: each move on the carriers, until the
    slot's work on the job returns."""

    def __init__(self) -> None:
        self.moves: list[Move] = []
        self.done = False

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if self.done or event not in ("call", "return"):
            return
        if event == "return":
            if frame.f_code.co_qualname == "Poller.work":
                self.done = True
            return
        to = _file(frame)
        if to is None or frame.f_code.co_name == "__exit__":
            return
        caller, carried, in_pool = None, False, False
        back = frame.f_back
        while back is not None:
            named = _file(back)
            caller = caller or named
            carried = carried or back.f_code.co_qualname in CARRIERS
            in_pool = in_pool or named in POOL
            back = back.f_back
        if caller is None or caller == to or in_pool or not carried:
            return
        function = "<handler>" if to == HANDLER else frame.f_code.co_qualname
        self.moves.append((caller, to, function))


def walk_table() -> list[Move]:
    """The moves of ARCHITECTURE.md's walk table, in order."""
    text = ARCHITECTURE.read_text()
    section = text.split("## The walk of one job", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| \d+ \| `([^`]+)` \| `([^`]+)` \| `([^`]+)` \|", section, re.M)
    return [(a, b, c) for a, b, c in rows]


def enqueue_to_a_sleeping_queue(db) -> None:
    # The queue's poller is asleep: the job comes to it by a wakeup.
    wait_for(lambda: db.query_row("SELECT wake_wanted FROM job_queues WHERE queue = 'walk'") == (True,), 10)
    gevent.sleep(0.2)
    with db.transaction() as tx:
        insert(tx.conn, "walk", "walk.one", {})


@contextmanager
def worker_log() -> Iterator[None]:
    """The job's log line formatted as the worker's own log does it."""
    handler = logging.StreamHandler(io.StringIO())
    handler.setFormatter(logs.formatter("text", ["a-secret"]))
    jobs = logging.getLogger("jobs")
    level = jobs.level
    jobs.addHandler(handler)
    jobs.setLevel(logging.INFO)
    try:
        yield
    finally:
        jobs.removeHandler(handler)
        jobs.setLevel(level)


def traced_walk(db) -> list[Move]:
    """The moves of one job enqueued to an idle queue of a running worker,
    from the wakeup to the stored outcome. A first job runs untraced: the
    walk is a worker's steady state, not what it makes once."""
    tracer = Tracer()
    # Counted for /metrics, as a worker that serves them counts every job.
    counters.counted_by(metrics)
    registry = [lambda db: Queue("walk", {"walk.one": handler})]
    with worker_log(), running_worker(db, registry):
        enqueue_to_a_sleeping_queue(db)
        wait_for(lambda: db.query_row("SELECT count(*) FROM jobs WHERE status = 'ok'") == (1,), 10)
        sys.setprofile(tracer)
        try:
            enqueue_to_a_sleeping_queue(db)
            wait_for(lambda: tracer.done, 10)
        finally:
            sys.setprofile(None)
    assert db.query("SELECT status FROM jobs") == [("ok",), ("ok",)]
    return tracer.moves


def test_the_walk_of_one_job_is_the_one_architecture_md_tells(db):
    moves = traced_walk(db)
    for move in moves:
        print(" | ".join(move))
    assert moves == walk_table()


def test_the_walk_is_short_and_enters_each_stage_once():
    """At most MOST_MOVES moves, and no function entered twice but the
    pool's statement: once for the claim's round trip, once for the write's."""
    table = walk_table()
    assert 0 < len(table) <= MOST_MOVES
    entered = [(to, function) for _, to, function in table]
    again = {e for e in entered if entered.count(e) > 1}
    assert again == {("lib/store/db.py", "_Reserved.query_within")}, again
