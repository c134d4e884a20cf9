from datetime import UTC, datetime, timedelta

import psycopg2.errors
import pytest
from tests_support import count_jobs, make_poller, paused, run_python

from lib.insert import Job, insert, insert_many
from lib.operate.queue_state import pause, resume
from lib.store.sql import Q


@pytest.fixture
def dedupe_q(db):
    db.exec("TRUNCATE job_dedupe_names, job_queues")
    poller = make_poller("d", db, {"d.Once": lambda job: "ok", "d.Many": lambda job: "ok"}, dedupe={"d.Once"})
    db.exec(Q.dedupe_declare, {"queue": "d", "names": sorted(poller.definition.dedupe)})
    return poller


def test_a_second_pending_copy_is_refused(db, dedupe_q):
    first = insert(db, "d", "d.Once", {"id": 1, "tags": ["a"]})
    assert first is not None
    assert insert(db, "d", "d.Once", {"tags": ["a"], "id": 1}) is None  # same args, other key order
    assert insert(db, "d", "d.Once", {"id": 2}) is not None
    assert insert(db, "d", "d.Many", {"id": 1}) is not None  # a name that did not opt in
    assert insert(db, "d", "d.Many", {"id": 1}) is not None
    assert count_jobs(db) == 4


def test_dedupe_holds_while_started_and_ends_when_finished(db, dedupe_q):
    insert(db, "d", "d.Once", {"id": 1})
    job = dedupe_q.claim()
    assert insert(db, "d", "d.Once", {"id": 1}) is None
    dedupe_q.run(job)
    assert insert(db, "d", "d.Once", {"id": 1}) is not None


def test_dedupe_with_large_args(db, dedupe_q):
    big = {"blob": "x" * 200_000, "n": 1}
    assert insert(db, "d", "d.Once", big) is not None
    assert insert(db, "d", "d.Once", big) is None
    assert insert(db, "d", "d.Once", {**big, "n": 2}) is not None


def test_dedupe_applies_to_every_writer(db, dedupe_q):
    ids = insert_many(db, [Job("d", "d.Once", {"k": 1}), Job("d", "d.Once", {"k": 1}), Job("d", "d.Once", {"k": 2})])
    assert len(ids) == 2
    # An application's own INSERT, written by hand past lib.insert.
    db.exec("INSERT INTO jobs (queue, name, args) VALUES ('d', 'd.Once', '{\"k\": 3}') ON CONFLICT DO NOTHING")
    db.exec("INSERT INTO jobs (queue, name, args) VALUES ('d', 'd.Once', '{\"k\": 3}') ON CONFLICT DO NOTHING")
    assert count_jobs(db) == 3


def test_a_writer_cannot_name_a_rows_dedupe(db, dedupe_q):
    """The database decides which rows dedupe, whatever a writer puts in the
    column: a value that disagrees with the declared names is refused whole."""
    for name, dedupe in (("d.Once", False), ("d.Many", True)):
        with pytest.raises(
            psycopg2.errors.CheckViolation, match=rf"dedupe of \(d, {name}\) must be {str(not dedupe).lower()}"
        ):
            db.exec(
                "INSERT INTO jobs (queue, name, dedupe) VALUES ('d', 'd.Many', false), ('d', %s, %s)", (name, dedupe)
            )
    assert count_jobs(db) == 0
    db.exec("INSERT INTO jobs (queue, name, dedupe) VALUES ('d', 'd.Once', true), ('d', 'd.Many', false)")
    db.exec(
        """INSERT INTO jobs (queue, name, args, dedupe) VALUES ('d', 'd.Once', '{"n": 2}', DEFAULT), ('d', 'd.Many', '{}', DEFAULT)"""
    )
    assert db.query("SELECT name, dedupe FROM jobs ORDER BY id") == [
        ("d.Once", True),
        ("d.Many", False),
        ("d.Once", True),
        ("d.Many", False),
    ]


def test_insert_reads_dedupe_without_a_call_per_row(db, admin_db, dedupe_q):
    """lib.insert names each row's dedupe in its own statement: the per-row
    trigger (a PL/pgSQL call a row) is left to writers that leave it out."""
    jobs = [Job("d", name, {"k": i % 300}) for i in range(1000) for name in ("d.Once", "d.Many")][:1000]

    def set_dedupe_calls(tx) -> int:
        (calls,) = tx.query_row(
            "SELECT coalesce(sum(f.calls), 0) FROM pg_stat_xact_user_functions f WHERE f.funcname = 'jobs_set_dedupe'"
        )
        return calls

    with admin_db.transaction() as tx:  # track_functions is an administrator's setting
        tx.exec("SET LOCAL track_functions = 'pl'")
        ids = insert_many(tx, jobs)
        insert(tx, "d", "d.Once", {"k": 1000})
        assert set_dedupe_calls(tx) == 0
        tx.exec(
            "INSERT INTO jobs (queue, name, args) SELECT 'd', 'd.Once', '{}' FROM generate_series(1, 3) ON CONFLICT DO NOTHING"
        )
        assert set_dedupe_calls(tx) == 3
    # 300 distinct d.Once args in the 500 d.Once rows; every d.Many row; the
    # single insert; one of the three identical plain-SQL rows.
    assert len(ids) == 300 + 500
    assert count_jobs(db, "name = 'd.Once' AND dedupe") == 302
    assert count_jobs(db, "name = 'd.Many' AND NOT dedupe") == 500


def test_dedupe_must_name_handled_jobs(db):
    with pytest.raises(ValueError, match="does not handle"):
        make_poller("d", db, {"d.A": lambda job: "ok"}, dedupe={"d.B"})


_THROTTLED_WORKER = """
from gevent.event import Event
from lib.store.db import DB
from lib.run.poller import Poller
from lib.run.queue import Queue
from lib.run.runtime import Runtime
db = DB.connect({url!r}, size=2)
queue = Queue("t", {{"t.N": lambda job: "ok"}}, throttle=lambda status, error, elapsed: 30.0)
poller = Poller(queue, db, Runtime.alone(db))
# Stopping: this process does not sit the pause out itself; the queue's other workers must.
stopping = Event()
stopping.set()
print(poller.work_once(stop=stopping))
"""


def test_throttle_holds_for_the_queue_across_processes(db, database_url):
    """A worker process runs one job of queue t, whose throttle asks for 30 s,
    and exits; this process, a worker of its own, must not claim t's next job
    before the 30 s are up."""
    db.exec("TRUNCATE job_queues")
    first, second = insert(db, "t", "t.N"), insert(db, "t", "t.N")
    done = run_python(_THROTTLED_WORKER.format(url=database_url))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
    assert dict(db.query("SELECT id, status FROM jobs")) == {first: "ok", second: "pending"}
    other = make_poller("t", db, {"t.N": lambda job: "ok"})
    job, wait = other.steps.claim(None, 0)
    assert job is None and 0 < wait <= 30
    assert count_jobs(db, "status = 'pending'") == 1
    # Once the pause is over (moved back by hand here), any worker goes on.
    db.exec("UPDATE job_queues SET next_claim_at = now() - interval '1 second'")
    assert other.work_once() == "ok"


def test_no_throttle_writes_no_gate(db):
    db.exec("TRUNCATE job_queues")
    insert(db, "n", "n.N")
    make_poller("n", db, {"n.N": lambda job: "ok"}).work_once()
    assert db.query("SELECT * FROM job_queues") == []


def test_pause_and_resume_for_every_worker(db):
    db.exec("TRUNCATE job_queues")
    poller = make_poller("p", db, {"p.N": lambda job: "ok"})
    insert(db, "p", "p.N")
    pause(db, "p", "vendor maintenance")
    assert poller.work_once() is None
    assert [(q, r) for q, r, _ in paused(db)] == [("p", "vendor maintenance")]
    assert resume(db, "p")
    assert poller.work_once() == "ok"
    assert not resume(db, "p")


def test_pause_with_an_end_time_ends_by_itself(db):
    db.exec("TRUNCATE job_queues")
    poller = make_poller("p", db, {"p.N": lambda job: "ok"})
    insert(db, "p", "p.N")
    pause(db, "p", "brief", until=datetime.now(UTC) + timedelta(hours=1))
    job, wait = poller.steps.claim(None, 0)
    assert job is None and 3500 < wait <= 3600
    pause(db, "p", "brief", until=datetime.now(UTC) - timedelta(seconds=1))
    assert poller.work_once() == "ok"


def test_resume_by_prefix_leaves_other_pauses(db):
    db.exec("TRUNCATE job_queues")
    pause(db, "a", "auth: token rejected")
    pause(db, "b", "by hand")
    assert resume(db, "a", prefix="auth: ")
    assert not resume(db, "b", prefix="auth: ")
    assert [q for q, _, _ in paused(db)] == ["b"]


def test_idle_poller_learns_when_its_next_delayed_job_is_due(db):
    poller = make_poller("r", db, {"r.N": lambda job: "ok"})
    insert(db, "r", "r.N", run_at=datetime.now(UTC) + timedelta(seconds=90))
    job, wait = poller.steps.claim(None, 0)
    assert job is None and 80 < wait <= 90


def test_a_bulk_load_with_triggers_off_still_gets_dedupe(db, admin_db, dedupe_q):
    """A session that turns triggers off (session_replication_role = replica,
    an administrator's setting) and leaves dedupe out gets it filled in all
    the same, not a NULL refused."""
    with admin_db.transaction() as tx:
        tx.exec("SET LOCAL session_replication_role = replica")
        tx.exec("INSERT INTO jobs (queue, name, args) VALUES ('d', 'd.Once', '{}'), ('d', 'd.Many', '{}')")
    assert db.query("SELECT name, dedupe FROM jobs ORDER BY id") == [("d.Once", True), ("d.Many", False)]
