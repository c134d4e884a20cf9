"""The handler boundary: whatever a handler raises, returns or swallows, its
job ends with a status a person can read, its lease is let go, and the queue
behind it goes on."""

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction

import gevent
import pytest
from gevent.event import Event
from tests_support import ROOT, count_jobs, make_poller, wait_for

import lib.run.execute
from lib.insert import insert
from lib.job import PendingJob, Snooze
from lib.job import status as st
from lib.run.execute import Outcome, Snoozed, decide
from lib.run.poller import Poller, throttle_pause
from lib.run.steps import Ask, batch_step
from lib.setup import counters
from lib.store.db import DB

FAULT_WORKER = ROOT / "tests" / "apps" / "fault_worker.py"

UNFINISHED = "status IN ('pending', 'started')"


def _ok(job: PendingJob) -> str:
    return "ok"


def _work_until(poller: Poller, done: Callable[[], bool], timeout: float = 20) -> None:
    """Run the poller's loop until done() holds; a slot that dies fails the
    test with what killed it, and a handler still running at the end is killed."""
    stop = Event()
    looping = gevent.spawn(poller.poll, stop)
    try:
        with gevent.Timeout(timeout):
            while not done():
                if looping.dead:
                    looping.get()  # raises what ended the loop
                    raise AssertionError("the poller's loop ended")
                gevent.sleep(0.02)
    finally:
        stop.set()
        poller.wake()
        looping.join(5)
        looping.kill()


def _rows(db: DB) -> dict[int, tuple[str, str | None]]:
    return {job_id: (status, tb) for job_id, status, tb in db.query("SELECT id, status, last_traceback FROM jobs")}


# 1. Text that cannot be made of a fault, or stored


class Unprintable(Exception):
    def __str__(self) -> str:
        raise ValueError("no text for this one")


def _raises_cut_emoji(job: PendingJob) -> str:
    raise RuntimeError("cut \ud83d")


def _raises_unprintable(job: PendingJob) -> str:
    raise Unprintable()


def _returns_cut_emoji(job: PendingJob) -> str:
    return "fail: cut \ud83d"


@pytest.mark.parametrize(
    ("handler", "status", "in_traceback"),
    [
        (_raises_cut_emoji, "err: RuntimeError: cut \\ud83d", "RuntimeError: cut \\ud83d"),
        (
            _raises_unprintable,
            "err: <unprintable Unprintable: __str__ raised ValueError>",
            "Unprintable: <exception str() failed>",
        ),
        (_returns_cut_emoji, "fail: cut \\ud83d", None),
    ],
)
def test_an_outcome_that_cannot_be_printed_ends_readably_and_the_queue_goes_on(db, handler, status, in_traceback):
    poller = make_poller("q", db, {"q.Bad": handler, "q.Next": _ok})
    bad, after = insert(db, "q", "q.Bad"), insert(db, "q", "q.Next")
    _work_until(poller, lambda: count_jobs(db, UNFINISHED) == 0)
    rows = _rows(db)
    assert rows[bad][0] == status
    if in_traceback is None:
        assert rows[bad][1] is None
    else:
        assert in_traceback in rows[bad][1] and f"in {handler.__name__}" in rows[bad][1], rows[bad][1]
    assert rows[after] == ("ok", None)
    assert poller.leases.held == {}


def test_a_fault_between_the_handler_and_the_write_still_ends_the_job(db, monkeypatch):
    """A bug in turning the handler's answer into an outcome: the job ends
    saying the worker could not record it, and the queue goes on."""
    poller = make_poller("q", db, {"q.N": _ok})

    def broken(happened: object, attempts: int, max_attempts: int, *, retry_base: float) -> Outcome:
        raise RuntimeError("a bug in the outcome")

    monkeypatch.setattr(lib.run.execute, "decide", broken)
    ids = [insert(db, "q", "q.N") for _ in range(2)]
    _work_until(poller, lambda: count_jobs(db, UNFINISHED) == 0)
    rows = _rows(db)
    expected = "err: the worker could not record this job's outcome: RuntimeError: a bug in the outcome"
    assert [rows[i][0] for i in ids] == [expected, expected]
    assert "in broken" in rows[ids[0]][1]
    assert poller.leases.held == {}


def test_a_fault_after_the_write_loses_neither_the_job_claimed_with_it_nor_the_slot(db, monkeypatch):
    """The outcome's write also claimed the next job; counting the outcome
    then fails: that next job still runs, in this slot."""

    def broken(queue: str, outcome: Outcome, seconds: float) -> None:
        raise RuntimeError("a bug in counting")

    monkeypatch.setattr(counters, "job_done", broken)
    poller = make_poller("q", db, {"q.N": _ok})
    ids = [insert(db, "q", "q.N") for _ in range(3)]
    _work_until(poller, lambda: count_jobs(db, UNFINISHED) == 0)
    assert [_rows(db)[i][0] for i in ids] == ["ok", "ok", "ok"]
    assert poller.leases.held == {}


# 2. A timeout the handler catches


def test_a_handler_that_catches_every_exception_in_a_loop_is_still_timed_out(db):
    def retries_for_ever(job: PendingJob) -> str:
        while True:
            try:  # noqa: SIM105 - written as handlers write it
                gevent.sleep(0.1)
            except Exception:
                pass

    poller = make_poller("q", db, {"q.Loop": retries_for_ever, "q.Next": _ok}, job_timeout=1)
    looping, after = insert(db, "q", "q.Loop"), insert(db, "q", "q.Next")
    began = time.monotonic()
    _work_until(poller, lambda: count_jobs(db, UNFINISHED) == 0, timeout=15)
    rows = _rows(db)
    assert rows[looping][0] == "err: JobTimeout: timed out after 1s"
    assert rows[after][0] == "ok"
    assert time.monotonic() - began < 10
    assert poller.leases.held == {}


def test_a_handler_that_swallows_the_timeout_and_goes_on_is_thrown_it_again(db):
    caught = []

    def goes_on(job: PendingJob) -> str:
        try:
            gevent.sleep(30)
        except BaseException as exc:
            caught.append(type(exc).__name__)
        gevent.sleep(30)
        return "ok"

    poller = make_poller("q", db, {"q.GoesOn": goes_on}, job_timeout=1)
    insert(db, "q", "q.GoesOn")
    with gevent.Timeout(15):
        assert poller.work_once() == "err: JobTimeout: timed out after 1s"
    assert caught == ["JobTimeout"]


def test_a_handler_that_swallows_the_timeout_and_returns_is_recorded_as_timed_out(db):
    """Its status is not taken: the job ran out of time. The next job of the
    slot, longer than the pause between throws, is thrown nothing."""

    def swallows(job: PendingJob) -> str:
        try:  # noqa: SIM105 - written as handlers write it
            gevent.sleep(30)
        except BaseException:
            pass
        return "ok: as if nothing happened"

    poller = make_poller(
        "q", db, {"q.Swallow": swallows, "q.Next": lambda job: gevent.sleep(1.2) or "ok"}, job_timeout=2
    )
    swallowing, after = insert(db, "q", "q.Swallow"), insert(db, "q", "q.Next")
    _work_until(poller, lambda: count_jobs(db, UNFINISHED) == 0, timeout=20)
    rows = _rows(db)
    assert rows[swallowing][0] == "err: JobTimeout: timed out after 2s"
    assert "in swallows" in rows[swallowing][1]
    assert rows[after][0] == "ok"


# 3. Seconds that are numbers of another type, or no numbers


class OneAndAHalf:
    """A number of a library's own kind, known to Python only by its __float__."""

    def __float__(self) -> float:
        return 1.5


@pytest.mark.parametrize("seconds", [Decimal("1.5"), Fraction(3, 2), OneAndAHalf()])
def test_a_snooze_of_another_kind_of_number_is_a_float_and_stores_a_retry_that_far_out(db, seconds):
    snooze = Snooze(seconds, st.RATE_LIMITED)
    assert type(snooze.seconds) is float and snooze.seconds == 1.5

    def snoozes(job: PendingJob) -> str:
        raise Snooze(seconds, st.RATE_LIMITED)

    poller = make_poller("q", db, {"q.S": snoozes})
    job_id = insert(db, "q", "q.S")
    job = poller.claim()
    assert poller.run(job) == st.RATE_LIMITED
    status, attempts_left, due_in = db.query_row(
        "SELECT status, max_attempts - attempts, extract(epoch FROM run_at - now()) FROM jobs WHERE id = %s", (job_id,)
    )
    assert (status, attempts_left) == ("pending", 1)  # the attempt not counted
    assert 0.5 < due_in <= 1.5
    # Its outcome goes in a batch of the group commit with other outcomes.
    params = poller.steps.outcome_params(job, decide(Snoozed(snooze), job.attempts, job.max_attempts), 0.0)
    batch_step([Ask(params, None), Ask({**params, "id": job_id + 1}, None)])


@pytest.mark.parametrize(
    ("seconds", "status"),
    [
        (True, "err: TypeError: Snooze seconds must be a number, not a bool"),
        ("5", "err: TypeError: Snooze seconds must be a number, not str"),
        (float("nan"), "err: ValueError: Snooze seconds must be finite, not nan"),
        (float("inf"), "err: ValueError: Snooze seconds must be finite, not inf"),
    ],
)
def test_a_snooze_of_what_is_no_number_of_seconds_is_that_jobs_own_error(db, seconds, status):
    def snoozes(job: PendingJob) -> str:
        raise Snooze(seconds, st.RATE_LIMITED)

    poller = make_poller("q", db, {"q.S": snoozes, "q.Next": _ok})
    snoozing, after = insert(db, "q", "q.S"), insert(db, "q", "q.Next")
    assert poller.work_once() == status
    assert poller.work_once() == "ok"
    assert db.query_row("SELECT status FROM jobs WHERE id = %s", (snoozing,)) == (status,)
    assert db.query_row("SELECT status FROM jobs WHERE id = %s", (after,)) == ("ok",)


@pytest.mark.parametrize(
    ("answer", "pause"),
    [
        (Decimal("0.25"), 0.25),
        (Fraction(1, 4), 0.25),
        (OneAndAHalf(), 1.5),
        (2, 2.0),
        (True, 0.0),
        ("5", 0.0),
        (None, 0.0),
    ],
)
def test_the_throttles_answer_is_a_plain_float_or_no_pause(db, answer, pause):
    poller = make_poller("q", db, {"q.N": _ok}, throttle=lambda status, error, elapsed: answer)
    delay = throttle_pause(poller.throttle, poller.queue, Outcome("ok"), 0.0)
    assert type(delay) is float and delay == pause


# All three in a real worker process


@pytest.fixture
def fault_db(db):
    db.exec("DROP TABLE IF EXISTS fault_runs")
    db.exec("CREATE TABLE fault_runs (n serial, job_id bigint)")
    return db


def test_a_worker_process_ends_each_faulty_job_and_works_the_rest_in_order(fault_db, database_url, tmp_path):
    db = fault_db
    faulty = {
        "faults.CutEmoji": "err: RuntimeError: cut \\ud83d",
        "faults.Unprintable": "err: <unprintable Unprintable: __str__ raised ValueError>",
        "faults.CutStatus": "fail: cut \\ud83d",
        "faults.Loop": "err: JobTimeout: timed out after 1s",
        "faults.Swallow": "err: JobTimeout: timed out after 1s",
        "faults.SnoozeBool": "err: TypeError: Snooze seconds must be a number, not a bool",
        "faults.SnoozeDecimal": "ok: snoozed once",
    }
    good = [insert(db, "faults", "faults.Good")]
    bad = {}
    for name in faulty:
        bad[insert(db, "faults", name)] = name
        good.append(insert(db, "faults", "faults.Good"))
    log_file = tmp_path / "worker.log"
    with open(log_file, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(FAULT_WORKER)],
            env={"PATH": "/usr/bin:/bin", "JOBS_HTTP_ADDR": "off", "DATABASE_URL": database_url},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: count_jobs(db, UNFINISHED) == 0, 60)
        assert proc.poll() is None, log_file.read_text()[-3000:]  # still running
        statuses = dict(db.query("SELECT id, status FROM jobs"))
        assert {name: statuses[i] for i, name in bad.items()} == faulty
        assert [statuses[i] for i in good] == ["ok"] * len(good)
        assert [r[0] for r in db.query("SELECT job_id FROM fault_runs ORDER BY n")] == good
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        # No part died on the way: a supervised restart would hide a bug.
        assert " died: " not in log_file.read_text(), log_file.read_text()[-3000:]
    finally:
        proc.kill()
