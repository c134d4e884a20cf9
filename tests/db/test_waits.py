"""Jobs that wait for others (insert's after=): not due until every job they
name has ended; then due in their place, or ended as a skip naming the one
that ended other than ok; never in the way of the jobs behind them."""

import time

import gevent
import psycopg2
import pytest
from gevent.event import Event
from tests_support import make_poller, running_worker, wait_for

from lib.background.waits import Waits
from lib.insert import InvalidJob, Job, insert, insert_many
from lib.run.queue import Queue


def status_of(db, job_id: int) -> str:
    return db.query_row("SELECT status FROM jobs WHERE id = %s", (job_id,))[0]


def released(db) -> int:
    return Waits(db).release()


def test_a_job_waits_until_every_job_it_names_has_ended_ok(db):
    a = make_poller("a", db, {"a.N": lambda job: "ok"})
    b = make_poller("b", db, {"b.N": lambda job: "ok"})
    sink = make_poller("sink", db, {"sink.N": lambda job: "ok"})
    first, second = insert(db, "a", "a.N"), insert(db, "b", "b.N")
    waiter = insert(db, "sink", "sink.N", after=[first, second])
    assert sink.work_once() is None  # not due
    assert a.work_once() == "ok"
    assert released(db) == 0
    assert sink.work_once() is None  # one still to end
    assert b.work_once() == "ok"
    assert released(db) == 1
    assert sink.work_once() == "ok"
    assert status_of(db, waiter) == "ok"
    assert db.query_row("SELECT count(*) FROM job_waits") == (0,)
    assert db.query_row("SELECT count(*) FROM job_waiters") == (0,)


def test_a_waiting_job_is_not_in_the_way_of_the_jobs_behind_it(db):
    dep = insert(db, "slow", "slow.N")
    waiter = insert(db, "q", "q.N", {"n": 0}, after=[dep])
    later = [insert(db, "q", "q.N", {"n": n}) for n in (1, 2)]
    order = []
    poller = make_poller("q", db, {"q.N": lambda job: order.append(job.id) or "ok"})
    assert poller.work_once() == "ok"
    assert poller.work_once() == "ok"
    assert poller.work_once() is None
    assert order == later
    assert status_of(db, waiter) == "pending"


def test_a_job_that_ends_other_than_ok_skips_its_waiters_and_theirs(db):
    def boom(job):
        raise RuntimeError("the API said no")

    a = make_poller("a", db, {"a.N": boom})
    dep = insert(db, "a", "a.N")
    middle = insert(db, "b", "b.N", after=[dep])
    last = insert(db, "c", "c.N", after=[middle])
    anyway = insert(db, "c", "c.N", after=[dep], after_any_outcome=True)
    assert a.work_once() == "err: RuntimeError: the API said no"
    assert released(db) == 2  # middle skipped, anyway due
    assert status_of(db, middle) == f"skip: after job {dep}, which ended err: RuntimeError: the API said no"
    assert released(db) == 1  # the skip of middle ends last
    assert status_of(db, last).startswith(f"skip: after job {middle}, which ended skip: after job {dep}")
    c = make_poller("c", db, {"c.N": lambda job: "ok"})
    assert c.work_once() == "ok"
    assert status_of(db, anyway) == "ok"


def test_jobs_already_ended_count_at_insert(db):
    done = insert(db, "a", "a.N")
    gone = insert(db, "a", "a.N")
    db.exec("UPDATE jobs SET status = 'ok', finished_at = now() WHERE id = %s", (done,))
    db.exec("UPDATE jobs SET status = 'fail: no such lead', finished_at = now() WHERE id = %s", (gone,))
    due = insert(db, "b", "b.N", after=[done])
    skipped = insert(db, "b", "b.N", after=[done, gone])
    assert db.query_row("SELECT run_at <= now() FROM jobs WHERE id = %s", (due,)) == (True,)
    assert status_of(db, skipped) == f"skip: after job {gone}, which ended fail: no such lead"


def test_a_wait_on_a_job_that_does_not_exist_is_refused_with_the_insert(db, database_url):
    dep = insert(db, "a", "a.N")
    conn = psycopg2.connect(database_url)
    try:
        with (
            pytest.raises(psycopg2.errors.ForeignKeyViolation, match="after: no job 999999"),
            conn,
            conn.cursor() as cur,
        ):
            insert(cur, "b", "b.N", after=[dep, 999999])
    finally:
        conn.close()
    assert db.query("SELECT id FROM jobs") == [(dep,)]
    assert db.query_row("SELECT waited_on FROM jobs WHERE id = %s", (dep,)) == (None,)


def test_no_wait_is_a_cycle_a_job_naming_its_own_id_is_refused(db, database_url):
    # A job may only wait for jobs that exist when it is written, and no wait is
    # added later, so the one cycle a caller could make is a job naming the id
    # its own insert is about to take.
    dep = insert(db, "a", "a.N")
    own = db.query_row("SELECT setval('jobs_id_seq', %s) + 1", (dep + 10,))[0]
    conn = psycopg2.connect(database_url)
    try:
        with (
            pytest.raises(psycopg2.errors.CheckViolation, match=f"after: job {own} cannot wait for itself"),
            conn,
            conn.cursor() as cur,
        ):
            insert(cur, "b", "b.N", after=[dep, own])
    finally:
        conn.close()
    assert db.query("SELECT id FROM jobs") == [(dep,)]
    assert db.query_row("SELECT count(*) FROM job_waits") == (0,)


@pytest.mark.parametrize("after", ["12", [0], [True], [1.5], 7])
def test_after_must_name_job_ids(db, after):
    with pytest.raises(InvalidJob, match="after must"):
        insert(db, "b", "b.N", after=after)
    assert db.query_row("SELECT count(*) FROM jobs") == (0,)


def test_a_rolled_back_insert_leaves_no_wait(db, database_url):
    dep = insert(db, "a", "a.N")
    conn = psycopg2.connect(database_url)
    with conn.cursor() as cur:
        insert(cur, "b", "b.N", after=[dep])
    conn.rollback()
    conn.close()
    assert db.query_row("SELECT count(*) FROM jobs") == (1,)
    assert db.query_row("SELECT count(*) FROM job_waits") == (0,)


def test_insert_many_and_follow_ups_wait_too(db):
    dep = insert(db, "a", "a.N")
    ids = insert_many(db, [Job("b", "b.N", {"n": 1}, after=(dep,)), Job("b", "b.N", {"n": 2})])
    assert len(ids) == 2
    assert db.query("SELECT waiter FROM job_waits") == [(ids[0],)]

    def parent(job):
        job.then("c", "c.N", after=[dep])
        return "ok"

    p = make_poller("p", db, {"p.N": parent})
    insert(db, "p", "p.N")
    assert p.work_once() == "ok"
    [(follow,)] = db.query("SELECT id FROM jobs WHERE queue = 'c'")
    assert db.query("SELECT dep FROM job_waits WHERE waiter = %s", (follow,)) == [(dep,)]


def test_a_running_worker_starts_a_waiting_job_soon_after_its_last_job_ends(db):
    registry = [
        lambda db: Queue("dep", {"dep.N": lambda job: time.sleep(0.3) or "ok"}),
        lambda db: Queue("sink", {"sink.N": lambda job: "ok"}),
    ]
    with running_worker(db, registry):
        deps = [insert(db, "dep", "dep.N") for _ in range(3)]
        waiter = insert(db, "sink", "sink.N", after=deps)
        wait_for(lambda: status_of(db, waiter) == "ok", 15)
    ended = db.query_row("SELECT max(finished_at) FROM jobs WHERE id = ANY(%s)", (deps,))[0]
    started = db.query_row("SELECT started_at FROM jobs WHERE id = %s", (waiter,))[0]
    assert ended <= started
    # Within a wakeup's latency, not a fallback poll's (120 s).
    assert (started - ended).total_seconds() < 2.0


def test_a_waiter_whose_row_another_transaction_holds_keeps_no_other_waiting(db, database_url):
    a = make_poller("a", db, {"a.N": lambda job: "ok"})
    dep = insert(db, "a", "a.N")
    held_one, free_one = (insert(db, "b", "b.N", {"n": n}, after=[dep]) for n in (1, 2))
    assert a.work_once() == "ok"
    holder = psycopg2.connect(database_url)
    try:
        with holder.cursor() as cur:
            cur.execute("SELECT 1 FROM jobs WHERE id = %s FOR UPDATE", (held_one,))
        waits = Waits(db)
        assert (waits.release(), waits.held) == (1, 1)
        assert db.query_row("SELECT run_at < now() FROM jobs WHERE id = %s", (free_one,)) == (True,)
    finally:
        holder.rollback()
        holder.close()
    assert (waits.release(), waits.held) == (1, 0)
    assert db.query_row("SELECT run_at < now() FROM jobs WHERE id = %s", (held_one,)) == (True,)


def ended_with_a_waiter(db) -> int:
    """A waiter whose one job was ended by hand, with no worker running: its
    notification reached nobody."""
    dep = insert(db, "dep", "dep.N")
    waiter = insert(db, "sink", "sink.N", after=[dep])
    db.exec("UPDATE jobs SET status = 'ok', finished_at = now() WHERE id = %s", (dep,))
    return waiter


def test_a_starting_worker_releases_the_waiters_of_jobs_that_ended_while_none_listened(db):
    waiter = ended_with_a_waiter(db)
    registry = [lambda db: Queue("sink", {"sink.N": lambda job: "ok"})]
    began = time.monotonic()
    with running_worker(db, registry):
        # Within the start's look, not a fallback poll's (120 s).
        wait_for(lambda: status_of(db, waiter) == "ok", 10)
    assert time.monotonic() - began < 10


def test_with_a_listener_the_first_look_waits_for_it_and_without_one_comes_at_start(db):
    def due(job_id: int) -> bool:
        return db.query_row("SELECT run_at < now() FROM jobs WHERE id = %s", (job_id,))[0]

    stop = Event()
    # With a listener (every=None), its LISTEN coming up asks for the first
    # look (Listener's wake_all): no look before it, beside the pollers' first claims.
    heard, waiter = Waits(db), ended_with_a_waiter(db)
    run = gevent.spawn(heard.run, stop)
    try:
        gevent.sleep(0.5)
        assert not due(waiter)
        heard.wake()
        wait_for(lambda: due(waiter), 5, what="the look the listener asked for")
    finally:
        stop.set()
        run.join(timeout=5)
    # Without one, nobody will ask: the first look comes at start.
    stop, polled, waiter = Event(), Waits(db, every=60.0), ended_with_a_waiter(db)
    run = gevent.spawn(polled.run, stop)
    try:
        wait_for(lambda: due(waiter), 5, what="the look at start without a listener")
    finally:
        stop.set()
        run.join(timeout=5)
