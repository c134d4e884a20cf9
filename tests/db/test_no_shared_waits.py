"""No statement that carries several jobs waits on one row, one value or one
silent link: a row another transaction holds, a value one ask cannot send, a
row no err: status fits and a server that never answers each stay that one
job's business, by planting rows and holding locks from a second session."""

import base64
import logging
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal

import gevent
import psycopg2
import pytest
from factory import ago, make_job
from gevent import monkey
from tests_support import make_poller, wait_for, waiting_on

from lib.background.leases import Leases
from lib.insert import MAX_NAME_CHARS, InvalidJob, insert
from lib.job import status as st
from lib.run.execute import Outcome
from lib.run.poller import Poller
from lib.run.runtime import Runtime
from lib.store.db import DB
from lib.store.driver_errors import Unsendable
from lib.store.pool_connections import deadline_connection

# A native thread, as the lease renewal's (threading's is a greenlet once patched).
_start_thread = monkey.get_original("_thread", "start_new_thread")


@contextmanager
def row_held(database_url: str, job_id: int) -> Iterator[psycopg2.extensions.connection]:
    """A person's open transaction on one job's row: BEGIN; UPDATE jobs ... WHERE id = job_id."""
    conn = psycopg2.connect(database_url)
    try:
        with conn.cursor() as cur:
            cur.execute("UPDATE jobs SET priority = priority WHERE id = %s", (job_id,))
        yield conn
    finally:
        conn.rollback()
        conn.close()


def _claimed(db: DB, queues: list[str]) -> list[tuple[Poller, object]]:
    """A job claimed on each queue, by pollers of one process (one runtime)."""
    runtime = Runtime.alone(db)
    out = []
    for queue in queues:
        poller = make_poller(queue, db, {f"{queue}.N": lambda job: "ok"}, runtime=runtime)
        insert(db, queue, f"{queue}.N")
        job = poller.claim()
        assert job is not None
        out.append((poller, job))
    return out


def test_a_heartbeat_renews_every_row_but_one_another_transaction_holds(db, database_url):
    claimed = _claimed(db, ["a", "b", "c"])
    leases = claimed[0][0].leases
    for _, job in claimed:
        leases.hold(job.id, 0.0, lambda: None)
        db.exec("UPDATE jobs SET worker_id = %s WHERE id = %s", (leases.worker_id, job.id))
    held_id = claimed[1][1].id
    with row_held(database_url, held_id), gevent.Timeout(5):
        assert leases.heartbeat() == 2
        assert not waiting_on(db, "transactionid")
    assert leases.held[held_id].good_until == 0.0 + leases.lease - leases.margin
    assert leases.fence_lapsed() == [held_id]


def test_the_rescue_takes_every_lost_row_but_one_another_transaction_holds(db, database_url):
    claimed = _claimed(db, ["a", "b", "c"])
    db.exec("UPDATE jobs SET lease_until = now() - interval '1 minute'")
    held_id = claimed[0][1].id
    with row_held(database_url, held_id), gevent.Timeout(5):
        rescued = Leases(db, worker_id="rescuer").rescue()
    assert sorted(r[0] for r in rescued) == sorted(job.id for _, job in claimed[1:])
    # Taken once the transaction ends.
    assert [r[0] for r in Leases(db, worker_id="rescuer").rescue()] == [held_id]


def test_a_row_no_err_status_fits_is_ended_alone_and_the_rescue_takes_the_rest(db, sentry_events):
    """A name too long for the err: rows' index, written before insert refused
    such names: the rescue for all lost rows fails on it, so each is taken
    alone; it ends with a fail: status saying why, the others as usual."""
    claimed = _claimed(db, ["a", "b"])
    # Random, so that no compression brings it under the index's limit.
    long_name = base64.b64encode(os.urandom(6000)).decode()
    make_job(
        db, "a", long_name, status="started", max_attempts=1, worker_id="gone", slot=None, lease_until=ago(minutes=1)
    )
    db.exec("UPDATE jobs SET lease_until = now() - interval '1 minute'")
    rescued = Leases(db, worker_id="rescuer").rescue()
    statuses = {r[0]: r[3] for r in rescued}
    assert len(statuses) == 3
    for _, job in claimed:
        assert statuses[job.id] == "err: interrupted"
    (bad,) = set(statuses) - {job.id for _, job in claimed}
    assert statuses[bad].startswith("fail: interrupted; no err: status can be stored for this row: ")
    assert "index row" in statuses[bad]
    assert db.query_row("SELECT count(*) FROM jobs WHERE status = 'started'") == (0,)
    assert len(sentry_events) == 1
    # The next rescue finds nothing to take, and does not fail.
    assert Leases(db, worker_id="rescuer").rescue() == []


def test_insert_refuses_a_name_or_queue_no_index_can_hold():
    for queue, name in (("q", "n" * (MAX_NAME_CHARS + 1)), ("q" * (MAX_NAME_CHARS + 1), "n")):
        with pytest.raises(InvalidJob, match=f"the limit is {MAX_NAME_CHARS}"):
            insert(None, queue, name)


def test_a_batch_writes_every_outcome_but_one_whose_row_another_transaction_holds(db, database_url):
    claimed = _claimed(db, ["a", "b", "c"])
    held_job = claimed[1][1]
    with row_held(database_url, held_job.id), gevent.Timeout(5):
        asks = [
            gevent.spawn(p.completer.send, p.steps.outcome_params(job, Outcome("ok"), 0.0), None) for p, job in claimed
        ]
        gevent.joinall(asks, raise_error=True)
        assert not waiting_on(db, "transactionid")
    replies = [a.value for a in asks]
    assert [(r.written, r.held) for r in replies] == [(True, False), (False, True), (True, False)]
    assert db.query_row("SELECT status FROM jobs WHERE id = %s", (held_job.id,)) == ("started",)


def test_a_lone_outcome_on_a_held_row_is_sent_again_until_the_row_is_free(db, database_url, caplog):
    """One job's row is held past the job's end: its outcome is not written
    and waits on nothing; the worker sends it again until the transaction
    ends, then the row holds the outcome and the queue goes on."""
    poller = make_poller("q", db, {"q.N": lambda job: st.ok("done")})
    first, second = insert(db, "q", "q.N"), insert(db, "q", "q.N")
    job = poller.claim()
    assert job is not None and job.id == first
    with caplog.at_level(logging.WARNING, logger="jobs"), row_held(database_url, first) as holder:
        running = gevent.spawn(poller.run, job)
        wait_for(lambda: any("outcome not written yet" in r.getMessage() for r in caplog.records), timeout=5)
        gevent.sleep(0.3)  # a few more tries, each answered at once
        assert not running.ready()
        assert not waiting_on(db, "transactionid")
        assert db.query_row("SELECT status FROM jobs WHERE id = %s", (first,)) == ("started",)
        holder.commit()
        assert running.get(timeout=10) == "ok: done"
    assert db.query_row("SELECT status FROM jobs WHERE id = %s", (first,)) == ("ok: done",)
    assert poller.work_once() == "ok: done"
    assert db.query_row("SELECT status FROM jobs WHERE id = %s", (second,)) == ("ok: done",)


def test_a_throttling_outcome_whose_queue_row_is_held_waits_on_nothing(db, database_url):
    """A person's open transaction on the queue's row of job_queues (a pause,
    say): a throttling outcome of that queue is held back, the other queues'
    outcomes in the batch are written."""
    claimed = _claimed(db, ["a", "b"])
    db.exec("INSERT INTO job_queues (queue) VALUES ('a')")
    conn = psycopg2.connect(database_url)
    try:
        with conn.cursor() as cur:
            cur.execute("UPDATE job_queues SET paused_until = NULL WHERE queue = 'a'")
        with gevent.Timeout(5):
            asks = [
                gevent.spawn(p.completer.send, p.steps.outcome_params(job, Outcome("ok"), 5.0), None)
                for p, job in claimed
            ]
            gevent.joinall(asks, raise_error=True)
    finally:
        conn.rollback()
        conn.close()
    assert [(a.value.written, a.value.held) for a in asks] == [(False, True), (True, False)]


def test_a_value_one_ask_cannot_send_fails_that_ask_alone(db):
    """One outcome carries a value no batch column takes (a Decimal delay, an
    object for a status): the batch goes again ask by ask; a Decimal is then
    written as the number it is, an object fails its own ask alone."""
    claimed = _claimed(db, ["a", "b", "c", "d"])
    params = [p.steps.outcome_params(job, Outcome("ok"), 0.0) for p, job in claimed]
    params[0]["delay"] = Decimal("1.5")
    params[2]["status"] = object()
    asks = [gevent.spawn(p.completer.send, o, None) for (p, _), o in zip(claimed, params, strict=True)]
    gevent.joinall(asks, timeout=10)
    assert isinstance(asks[2].exception, Unsendable)
    assert [a.value.written for i, a in enumerate(asks) if i != 2] == [True, True, True]
    assert db.query_row("SELECT next_claim_at > now() FROM job_queues WHERE queue = 'a'") == (True,)


@contextmanager
def silent_server() -> Iterator[str]:
    """A TCP port that takes connections and the bytes sent to them (the
    kernel's backlog) and never answers: a link that stalls without closing."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    try:
        yield f"postgresql://jobs@127.0.0.1:{listener.getsockname()[1]}/jobs"
    finally:
        listener.close()


def test_a_native_thread_connection_gives_up_at_its_deadline_on_a_silent_link():
    outcome: list[BaseException | float] = []

    def connect(url: str) -> None:
        began = time.monotonic()
        try:
            psycopg2.connect(url, connection_factory=deadline_connection(began + 0.5))
        except psycopg2.OperationalError:
            outcome.append(time.monotonic() - began)
        except BaseException as exc:
            outcome.append(exc)

    with silent_server() as url:
        DB(url)  # installs the wait callback, from the hub's thread, as the worker's pool does
        _start_thread(connect, (url,))
        wait_for(lambda: outcome, timeout=10)
    assert len(outcome) == 1 and isinstance(outcome[0], float), outcome
    assert 0.4 <= outcome[0] < 3


def test_the_fence_runs_while_the_renewal_and_the_rescue_get_no_answer():
    """The server never answers: the renewal thread and the rescue each give
    up at their deadline, and the fence, which waits on neither, stops the
    job before its lease could lapse."""
    with silent_server() as url:
        leases = Leases(DB(url, size=1), lease=1.5)
        fenced: list[float] = []
        claimed = time.monotonic()
        leases.hold(1, claimed, lambda: fenced.append(time.monotonic()))
        stop = gevent.event.Event()
        keeper = gevent.spawn(leases.run, stop)
        try:
            began = time.monotonic()
            with pytest.raises(gevent.Timeout):
                leases.rescue()
            assert time.monotonic() - began < leases.rescue_deadline + 1
            wait_for(lambda: fenced, timeout=5)
            assert fenced[0] - claimed < 1.5
        finally:
            stop.set()
            keeper.get(timeout=5)
