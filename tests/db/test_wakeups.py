import time
import uuid

import gevent
import pytest
from factory import make_jobs
from gevent.event import Event
from tests_support import asleep, make_poller, run_python

from lib.insert import insert
from lib.store.wakeups import Listener


class Recorder:
    def __init__(self) -> None:
        self.woken: list[str] = []
        self.all = 0

    def wake(self, queue: str) -> None:
        self.woken.append(queue)

    def wake_all(self) -> None:
        self.all += 1


@pytest.fixture
def listening(database_url):
    recorder = Recorder()
    listener = Listener(database_url, recorder.wake, recorder.wake_all)
    stop = Event()
    g = gevent.spawn(listener.run, stop)
    assert listener.listening.wait(10)
    yield listener, recorder
    stop.set()
    g.kill()


def _wait(predicate, timeout=10.0):
    with gevent.Timeout(timeout):
        while not predicate():
            gevent.sleep(0.01)


def test_commit_from_another_process_wakes_the_poller_far_before_the_poll(db, database_url):
    """The poll interval is 60 s; a separate process's commit starts the job in well under that."""
    started = []
    poller = make_poller("q", db, {"q.N": lambda job: started.append(time.time()) or "ok"}, poll_interval=60)
    listener = Listener(database_url, lambda queue: poller.wake(), poller.wake)
    stop = Event()
    greenlets = [gevent.spawn(listener.run, stop), gevent.spawn(poller.poll, stop)]
    try:
        assert listener.listening.wait(10)
        gevent.sleep(0.2)  # the poller is now idle in its 60 s wait
        done = run_python(
            "import psycopg2, time\n"
            "from lib.insert import insert\n"
            f"conn = psycopg2.connect({database_url!r})\n"
            "insert(conn, 'q', 'q.N')\n"
            "conn.commit()\n"
            "print(time.time())\n"
        )
        assert done.returncode == 0, done.stderr
        committed = float(done.stdout)
        _wait(lambda: started, timeout=10)
        assert started[0] - committed < 5.0  # generous: the fallback poll is 60 s away
    finally:
        stop.set()
        poller.wake()
        gevent.joinall(greenlets, timeout=5)
        gevent.killall(greenlets)


def _settled(db, recorder: Recorder) -> list[str]:
    """The queues woken so far, once every notification already committed has
    arrived: a marker notified now is delivered after them (a listener gets
    notifications in commit order), so nothing is left on the way when it is in."""
    marker = f"marker-{uuid.uuid4().hex}"
    db.exec("SELECT pg_notify('jobs', %s)", (marker,))
    _wait(lambda: marker in recorder.woken)
    recorder.woken.remove(marker)
    return recorder.woken


def test_set_based_enqueue_wakes_once(db, admin_db, listening):
    """One notification for a 500-row INSERT ... SELECT, from a trigger that runs
    once per statement. A trigger run for each row would also reach the listener
    once (Postgres folds a transaction's identical notifications), but it calls
    pg_notify 500 times, so the calls are counted too."""
    _, recorder = listening
    asleep(db, "bulk")
    with admin_db.transaction() as tx:
        # Counts this transaction's calls of PL/pgSQL functions, triggers included (an administrator's setting).
        tx.exec("SET LOCAL track_functions = 'pl'")
        # An application's own set-based INSERT, written by hand: the trigger's case.
        tx.exec("INSERT INTO jobs (queue, name) SELECT 'bulk', 'bulk.N' FROM generate_series(1, 500)")
        (notify_calls,) = tx.query_row(
            "SELECT coalesce(sum(f.calls), 0) FROM pg_stat_xact_user_functions f "
            "JOIN pg_proc p ON p.oid = f.funcid WHERE p.prosrc LIKE '%%pg_notify%%'"
        )
    assert notify_calls == 1
    assert _settled(db, recorder) == ["bulk"]


def _trigger_calls(tx) -> int:
    """Runs of the statement trigger jobs_inserted so far in this transaction
    (track_functions = 'pl' set in it)."""
    (calls,) = tx.query_row(
        "SELECT coalesce(sum(calls), 0)::int FROM pg_stat_xact_user_functions WHERE funcname = 'jobs_inserted'"
    )
    return calls


def test_a_one_job_insert_wakes_its_queue_itself_and_other_writers_still_run_the_trigger(db, admin_db, listening):
    """lib.insert's one-job insert notifies by itself and passes the statement
    trigger over; the mark that lets it do so holds only inside its call, so
    a plain INSERT right after it in the same transaction runs the trigger."""
    _, recorder = listening
    asleep(db, "one", "plain")
    with admin_db.transaction() as tx:
        tx.exec("SET LOCAL track_functions = 'pl'")
        insert(tx, "one", "one.N")
        assert _trigger_calls(tx) == 0
        tx.exec("INSERT INTO jobs (queue, name) VALUES ('plain', 'plain.N')")  # another writer's, by hand
        assert _trigger_calls(tx) == 1
    assert sorted(_settled(db, recorder)) == ["one", "plain"]


def test_a_duplicate_the_dedupe_index_suppressed_wakes_nobody(db, listening):
    _, recorder = listening
    asleep(db, "dup")
    db.exec("INSERT INTO job_dedupe_names VALUES ('dup', 'dup.N')")
    assert insert(db, "dup", "dup.N", {"n": 1}) is not None
    assert _settled(db, recorder) == ["dup"]
    assert insert(db, "dup", "dup.N", {"n": 1}) is None
    assert _settled(db, recorder) == ["dup"]


def test_a_finished_job_wakes_nobody_but_a_handover_does(db, listening):
    _, recorder = listening
    asleep(db, "plain")
    make_jobs(db, 2, "plain")
    _wait(lambda: recorder.woken == ["plain"])
    poller = make_poller("plain", db, {"plain.N": lambda job: "ok"})
    # A finished job notifies no one: its poller goes on with the queue itself.
    assert poller.work_once() == "ok"
    assert _settled(db, recorder) == ["plain"]
    # A poller that stops gives the slot up and says so, for a poller elsewhere.
    stopping = Event()
    stopping.set()
    assert poller.work_once(stop=stopping) == "ok"
    _wait(lambda: recorder.woken == ["plain", "plain"])


def test_a_row_back_to_pending_wakes_a_sleeping_queue_and_a_rescue_any(db, listening):
    """A row back to pending (a retry, a redrive) wakes its queue when a poller
    of it sleeps: the poller whose job is retried is awake, and finds the
    retry when it is due. A rescue wakes the queue whatever: the lost worker
    held a slot of it."""
    _, recorder = listening
    from lib.background.leases import Leases

    def boom(job):
        raise RuntimeError("again")

    asleep(db, "r")
    job_id = insert(db, "r", "r.N", max_attempts=3)
    _wait(lambda: recorder.woken == ["r"])
    make_poller("r", db, {"r.N": boom}).work_once()  # claimed (the queue awake), back to pending for a retry
    assert _settled(db, recorder) == ["r"]
    asleep(db, "r")
    db.exec("UPDATE jobs SET status = 'err: boom', finished_at = now() WHERE id = %s", (job_id,))
    db.exec("UPDATE jobs SET status = 'pending', finished_at = NULL WHERE id = %s", (job_id,))  # redriven
    _wait(lambda: recorder.woken == ["r", "r"])
    insert(db, "s", "s.N")  # no poller of s sleeps: no wakeup
    make_poller("s", db, {"s.N": lambda job: "ok"}).claim()
    db.exec("UPDATE jobs SET lease_until = now() - interval '1 second' WHERE queue = 's'")
    Leases(db).rescue()
    _wait(lambda: recorder.woken == ["r", "r", "s"])


def test_rows_that_stay_unwoken_do_not_notify(db, listening):
    _, recorder = listening
    asleep(db, "x")
    job_id = insert(db, "x", "x.N")
    _wait(lambda: recorder.woken == ["x"])
    db.exec("UPDATE jobs SET priority = 5 WHERE id = %s", (job_id,))
    db.exec("UPDATE jobs SET last_error = 'note' WHERE id = %s", (job_id,))
    assert _settled(db, recorder) == ["x"]


def test_listener_recovers_after_its_connection_is_killed(db, listening, database_url):
    _, recorder = listening
    assert recorder.all == 1
    db.exec(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE application_name = 'jobs-listener' AND datname = current_database()"
    )
    asleep(db, "deaf", "after")
    insert(db, "deaf", "deaf.N")  # enqueued while nobody listens
    # On reconnecting it wakes every poller, so the row written while deaf is worked.
    _wait(lambda: recorder.all == 2)
    insert(db, "after", "after.N")
    _wait(lambda: "after" in recorder.woken)


def test_listener_recovers_after_a_database_restart():
    """On a private server it may restart: the listener reconnects by itself,
    wakes every poller once connected again (rows written while it was deaf),
    and routes new notifications."""
    from chaos_server import ChaosServer

    from lib.store.db import DB
    from lib.store.migrate import migrate

    with ChaosServer() as server:
        url = server.database("listen")
        db = DB.connect(url, size=2)
        migrate(db)
        recorder = Recorder()
        listener = Listener(url, recorder.wake, recorder.wake_all)
        stop = Event()
        g = gevent.spawn(listener.run, stop)
        try:
            assert listener.listening.wait(10)
            server.restart(down_seconds=1.0)
            # Woken all once more: it has connected again.
            _wait(lambda: recorder.all == 2, timeout=60)
            asleep(db, "back")  # the pool drops its dead connections by itself
            insert(db, "back", "back.N")
            _wait(lambda: "back" in recorder.woken)
        finally:
            stop.set()
            g.kill()
            db.close()
