import itertools
import logging
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import gevent
import psycopg2
import pytest
from gevent.event import Event
from tests_support import Gate, count_jobs, make_poller, poll_until, wait_for, waiting_on

from lib.background.leases import Leases
from lib.insert import insert
from lib.job import status as st
from lib.job.args import ArgsError, unmarshal_args
from lib.run.poller import Poller
from lib.run.runtime import Runtime
from lib.store.db import DB

# The advisory lock a test's trigger waits on. Advisory locks belong to one
# database, and each run of the suite has its own.
GATE = 7_100_001


def test_fifo_within_a_queue(db):
    order = []
    poller = make_poller("q", db, {"q.N": lambda job: order.append(job.args["n"]) or "ok"}, poll_interval=0.1)
    for n in range(30):
        insert(db, "q", "q.N", {"n": n})
    insert(db, "other", "other.N", {"n": -1})  # another queue's row is not this poller's
    poll_until([poller], lambda: len(order) == 30)
    assert order == list(range(30))
    assert count_jobs(db, "queue = 'other' AND status = 'pending'") == 1


def test_priority_then_due_time_then_id(db):
    order = []
    poller = make_poller("q", db, {"q.N": lambda job: order.append(job.args["n"]) or "ok"})
    now = datetime.now(UTC)
    insert(db, "q", "q.N", {"n": "late"}, run_at=now - timedelta(seconds=1))
    insert(db, "q", "q.N", {"n": "early"}, run_at=now - timedelta(seconds=5))
    insert(db, "q", "q.N", {"n": "urgent"}, priority=10)
    insert(db, "q", "q.N", {"n": "future"}, run_at=now + timedelta(hours=1), priority=99)
    while poller.work_once():
        pass
    assert order == ["urgent", "early", "late"]
    assert count_jobs(db, "status = 'pending'") == 1  # not due yet


def test_never_two_started_jobs_of_one_queue(db):
    """Three pollers of one queue in one process race for it; the database's
    slot index lets one job run at a time."""
    intervals = []

    def handler(job):
        (started,) = db.query_row("SELECT count(*) FROM jobs WHERE queue = 'q' AND status = 'started'")
        begin = gevent.get_hub().loop.now()
        gevent.sleep(0.02)
        intervals.append((begin, gevent.get_hub().loop.now(), started))
        return "ok"

    pollers = [make_poller("q", db, {"q.N": handler}, poll_interval=0.05) for _ in range(3)]
    for n in range(15):
        insert(db, "q", "q.N", {"n": n})
    stop = Event()
    greenlets = [gevent.spawn(p.poll, stop) for p in pollers]
    with gevent.Timeout(20):
        while count_jobs(db, "status = 'ok'") < 15:
            gevent.sleep(0.02)
    stop.set()
    for p in pollers:
        p.wake()
    gevent.joinall(greenlets, raise_error=True)
    assert len(intervals) == 15
    assert all(started == 1 for _, _, started in intervals)
    spans = sorted(intervals)
    assert all(a_end <= b_begin for (_, a_end, _), (b_begin, _, _) in itertools.pairwise(spans))


def test_claim_refused_while_the_queues_slot_is_taken(db):
    first = make_poller("q", db, {"q.N": lambda job: "ok"})
    other = make_poller("q", db, {"q.N": lambda job: "ok"})
    a, b = insert(db, "q", "q.N"), insert(db, "q", "q.N")
    assert first.claim().id == a
    assert other.claim() is None  # slot 0 of q is taken
    assert count_jobs(db, f"id = {b} AND status = 'pending'") == 1


def test_concurrency_two_runs_two_at_once(db):
    peak = []
    live = set()

    def handler(job):
        live.add(job.id)
        peak.append(len(live))
        gevent.sleep(0.05)
        live.discard(job.id)
        return "ok"

    poller = make_poller("q", db, {"q.N": handler}, concurrency=2, poll_interval=0.05)
    for _ in range(10):
        insert(db, "q", "q.N")
    poll_until([poller], lambda: count_jobs(db, "status = 'ok'") == 10)
    assert max(peak) == 2


def test_handler_that_raises_is_an_err_status_and_one_report(db, sentry_events):
    def boom(job):
        raise ValueError("the vendor said no")

    poller = make_poller("q", db, {"q.Boom": boom})
    secret = uuid.uuid4().hex  # made at run time, so the source shown in a stack frame cannot hold it
    job_id = insert(db, "q", "q.Boom", {"secret": secret})
    assert poller.work_once() == "err: ValueError: the vendor said no"
    row = db.query_row("SELECT status, last_error, finished_at IS NOT NULL FROM jobs WHERE id = %s", (job_id,))
    assert row == ("err: ValueError: the vendor said no", "err: ValueError: the vendor said no", True)
    assert len(sentry_events) == 1
    tags = sentry_events[0]["tags"]
    assert tags["queue"] == "q" and tags["job"] == "q.Boom" and str(tags["job_id"]) == str(job_id)
    assert tags["callsite"].startswith("tests/db/test_poller.py:")
    assert secret not in repr(sentry_events[0])


def test_handler_that_hangs_is_timed_out(db, sentry_events):
    poller = make_poller("q", db, {"q.Hang": lambda job: gevent.sleep(60) or "ok"}, job_timeout=0.2)
    job_id = insert(db, "q", "q.Hang")
    with gevent.Timeout(10):
        result = poller.work_once()
    assert result == "err: JobTimeout: timed out after 0.2s"
    assert db.query_row("SELECT status FROM jobs WHERE id = %s", (job_id,)) == (result,)
    assert len(sentry_events) == 1


def test_each_job_of_a_slot_gets_its_own_full_timeout(db):
    """The slot's one timer starts again for every job: a job that ran close
    to the limit leaves none of its time to the next; a hang after a quick
    job is cut at the limit, where its handler was, and the timer that cut
    it fires on no later job."""
    ran = []

    def handler(job):
        ran.append(job.args["i"])
        if job.args["mode"] == "hang":
            gevent.sleep(60)
        if job.args["mode"] == "close":
            gevent.sleep(0.3)
        return "ok"

    poller = make_poller("q", db, {"q.T": handler}, job_timeout=0.5)
    modes = ["close", "close", "hang", "quick", "hang", "close"]
    ids = [insert(db, "q", "q.T", {"i": i, "mode": mode}) for i, mode in enumerate(modes)]
    with gevent.Timeout(20):
        results = [poller.work_once() for _ in modes]
    timed_out = "err: JobTimeout: timed out after 0.5s"
    assert results == ["ok", "ok", timed_out, "ok", timed_out, "ok"]
    assert ran == list(range(len(modes)))
    (traceback,) = db.query_row("SELECT last_traceback FROM jobs WHERE id = %s", (ids[2],))
    assert "in handler" in traceback and "gevent.sleep(60)" in traceback


@pytest.mark.parametrize(
    ("returned", "expected"),
    [
        (42, "err: BadStatus: handler returned int, not a status string"),
        (None, "err: BadStatus: handler returned NoneType, not a status string"),
        ("done", "err: BadStatus: handler returned 'done', not a status"),
        ("err: quietly", "err: BadStatus: handler returned 'err: quietly'; a fault must be raised"),
    ],
)
def test_handler_that_returns_a_bad_value(db, sentry_events, returned, expected):
    poller = make_poller("q", db, {"q.Bad": lambda job: returned})
    insert(db, "q", "q.Bad")
    assert poller.work_once() == expected
    assert len(sentry_events) == 1


def test_unknown_job_and_bad_args_are_errors_that_harm_nothing_else(db):
    @dataclass
    class Args:
        login: str

    def handler(job):
        return st.ok(unmarshal_args(Args, job.args).login)

    poller = make_poller("q", db, {"q.Known": handler})
    insert(db, "q", "q.Unknown")
    insert(db, "q", "q.Known", {"login": 7})
    insert(db, "q", "q.Known", {"login": "ada"})
    assert poller.work_once() == "err: UnknownJob: unknown job 'q.Unknown' for queue q"
    assert poller.work_once() == "err: ArgsError: Args: field 'login' should be str, got int 7"
    assert poller.work_once() == "ok: ada"


def test_unmarshal_args_names_the_field():
    @dataclass
    class Args:
        id: int
        tags: list[str]
        note: str | None = None

    assert unmarshal_args(Args, {"id": 1, "tags": [], "extra": True}) == Args(1, [])
    assert unmarshal_args(Args, '{"id": 1, "tags": ["a"], "note": null}') == Args(1, ["a"])
    with pytest.raises(ArgsError, match="missing field 'tags'"):
        unmarshal_args(Args, {"id": 1})
    with pytest.raises(ArgsError, match="field 'id' should be int, got bool"):
        unmarshal_args(Args, {"id": True, "tags": []})
    with pytest.raises(ArgsError, match="not valid JSON"):
        unmarshal_args(Args, "{")
    with pytest.raises(ArgsError, match="JSON object"):
        unmarshal_args(Args, "[1]")


def test_a_failed_job_with_attempts_left_is_retried_later(db):
    calls = []

    def flaky(job):
        calls.append(job.attempts)
        raise RuntimeError(f"attempt {job.attempts}")

    poller = make_poller("q", db, {"q.Flaky": flaky}, max_attempts=2)
    job_id = insert(db, "q", "q.Flaky")
    assert poller.work_once() == "err: RuntimeError: attempt 1"
    row = db.query_row(
        "SELECT status, attempts, max_attempts, last_error, run_at > now() + interval '4 seconds' FROM jobs WHERE id = %s",
        (job_id,),
    )
    assert row == ("pending", 1, 2, "err: RuntimeError: attempt 1", True)
    assert poller.work_once() is None  # not due yet
    db.exec("UPDATE jobs SET run_at = now() WHERE id = %s", (job_id,))
    assert poller.work_once() == "err: RuntimeError: attempt 2"
    assert db.query_row("SELECT status, attempts FROM jobs WHERE id = %s", (job_id,)) == (
        "err: RuntimeError: attempt 2",
        2,
    )
    assert calls == [1, 2]


def test_finalize_survives_its_connection_being_killed(database_url, db, caplog):
    """The finalize's connection is killed while the statement is in flight (a
    trigger holds it on a lock the test owns); it runs once more on a fresh
    connection, and the outcome is written."""
    db.exec(
        "CREATE OR REPLACE FUNCTION slow_finalize() RETURNS trigger LANGUAGE plpgsql AS $$ "
        f"BEGIN IF NEW.status = 'ok: survived' THEN PERFORM pg_advisory_xact_lock_shared({GATE}); END IF; "
        "RETURN NEW; END $$"
    )
    db.exec("CREATE TRIGGER slow_finalize BEFORE UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION slow_finalize()")
    pool = DB.connect(database_url, size=2, application_name="jobs-victim")
    killed = []

    def kill_during_finalize(gate):
        # Waiting on the gate, the finalize is in flight: its update has begun.
        pids = wait_for(lambda: waiting_on(db, "advisory", "jobs-victim"))
        killed.extend(db.query("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (pids,)))
        gate.open()  # the second run may pass

    poller = make_poller("q", pool, {"q.N": lambda job: st.ok("survived")})
    job_id = insert(db, "q", "q.N")
    try:
        with Gate(database_url, GATE) as gate, caplog.at_level(logging.WARNING, logger="jobs"), gevent.Timeout(20):
            killer = gevent.spawn(kill_during_finalize, gate)
            assert poller.work_once() == "ok: survived"
            killer.get()
    finally:
        db.exec("DROP TRIGGER slow_finalize ON jobs")
        pool.close()
    assert killed == [(True,)]
    assert db.query_row("SELECT status FROM jobs WHERE id = %s", (job_id,)) == ("ok: survived",)
    assert any("outcome not written yet, trying again" in r.getMessage() for r in caplog.records)


def test_finalize_that_keeps_failing_is_tried_for_a_lease_past_its_own_then_left_to_the_rescue(
    db, sentry_events, caplog
):
    """Every run of this job's finalize loses its connection (a trigger ends
    its own session mid-update): the write is tried again with backoff until
    a lease after the job's own would lapse, then the failure is logged and
    reported once, and the row stays started, for the rescue to take back."""
    db.exec("DROP SEQUENCE IF EXISTS finalize_tries")
    db.exec("CREATE SEQUENCE finalize_tries")
    db.exec(
        "CREATE OR REPLACE FUNCTION doomed_finalize() RETURNS trigger LANGUAGE plpgsql AS $$ "
        "BEGIN IF NEW.status = 'ok: doomed' THEN "
        # A sequence, not a table: its count survives the aborted transactions.
        "  PERFORM nextval('finalize_tries'); "
        "  PERFORM pg_terminate_backend(pg_backend_pid()); "
        "  PERFORM pg_sleep(30); "  # the session ends at this sleep's first interrupt check
        "END IF; RETURN NEW; END $$"
    )
    db.exec("CREATE TRIGGER doomed_finalize BEFORE UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION doomed_finalize()")
    # Nothing renews it here: the lease holds for 1 s from the claim, fenced 0.1 s early.
    poller = make_poller("q", db, {"q.N": lambda job: st.ok("doomed")}, runtime=Runtime.alone(db, lease=1.0))
    poller.leases.margin = 0.1
    job_id = insert(db, "q", "q.N")
    try:
        with caplog.at_level(logging.WARNING, logger="jobs"), gevent.Timeout(20):
            began = time.monotonic()
            assert poller.work_once() == "ok: doomed"
            took = time.monotonic() - began
    finally:
        db.exec("DROP TRIGGER doomed_finalize ON jobs")
    (tries,) = db.query_row("SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM finalize_tries")
    db.exec("DROP SEQUENCE finalize_tries")
    assert tries >= 3
    # The last try goes as a lease after the job's own lapses (0.9 s + 1 s
    # from the claim), and the give-up follows it at once.
    assert 1.85 < took < 2.9
    assert db.query_row("SELECT status, lease_until IS NOT NULL FROM jobs WHERE id = %s", (job_id,)) == (
        "started",
        True,
    )
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "outcome not written within a lease after its own" in errors[0], errors
    assert len(sentry_events) == 1
    assert str(sentry_events[0]["tags"]["job_id"]) == str(job_id)
    # Left to the rescue: once its lease runs out, the row is taken back.
    db.exec("UPDATE jobs SET lease_until = now() - interval '1 second' WHERE id = %s", (job_id,))
    assert [r[0] for r in Leases(db).rescue()] == [job_id]


def test_an_outcome_for_a_row_rescued_meanwhile_is_dropped(db):
    """The lease ran out while the job ran (its heartbeat was cut off) and the
    rescue took the row back: the late outcome must not overwrite the rescue's."""
    poller = make_poller("q", db, {"q.N": lambda job: "ok"})
    job_id = insert(db, "q", "q.N")
    job = poller.claim()
    db.exec("UPDATE jobs SET lease_until = now() - interval '1 second' WHERE id = %s", (job_id,))
    assert [r[0] for r in Leases(db).rescue()] == [job_id]
    assert poller.run(job) == "ok"
    assert db.query_row("SELECT status FROM jobs WHERE id = %s", (job_id,)) == ("err: interrupted",)


def test_rescue_takes_expired_leases_only(db):
    live, dead, retry = insert(db, "q", "q.N"), insert(db, "r", "r.N"), insert(db, "s", "s.N", max_attempts=3)
    waiting = insert(db, "t", "t.N")
    for queue in ("q", "r", "s"):
        make_poller(queue, db, {f"{queue}.N": lambda job: "ok"}).claim()
    db.exec("UPDATE jobs SET lease_until = now() - interval '1 second' WHERE id IN (%s, %s)", (dead, retry))
    # A lease with little left is still a lease: its worker renews it in time.
    db.exec("UPDATE jobs SET lease_until = now() + interval '2 seconds' WHERE id = %s", (live,))
    rescued = Leases(db).rescue()
    assert sorted((r[0], r[3]) for r in rescued) == [(dead, "err: interrupted"), (retry, "pending")]
    rows = dict(db.query("SELECT id, status FROM jobs"))
    assert rows == {live: "started", dead: "err: interrupted", retry: "pending", waiting: "pending"}
    assert Leases(db).rescue() == []  # nothing is taken twice


def test_heartbeat_renews_only_running_jobs(db):
    poller = make_poller("q", db, {"q.N": lambda job: "ok"}, runtime=Runtime.alone(db, lease=120))
    insert(db, "q", "q.N")
    job = poller.claim()
    db.exec("UPDATE jobs SET lease_until = now() + interval '1 second'")
    poller.leases.hold(job.id, time.monotonic(), lambda: None)
    assert poller.leases.heartbeat() == 1
    assert db.query_row("SELECT lease_until > now() + interval '100 seconds' FROM jobs") == (True,)
    assert Leases(db).heartbeat() == 0


def test_throttle_gets_the_outcome_and_pauses_the_queue(db):
    seen = []

    def throttle(status, error, elapsed):
        seen.append((status, type(error).__name__ if error else None, elapsed >= 0))
        return 0.3

    def handler(job):
        if job.args.get("fail"):
            raise KeyError("x")
        return "ok"

    poller = make_poller("q", db, {"q.N": handler}, throttle=throttle)
    insert(db, "q", "q.N")
    insert(db, "q", "q.N", {"fail": True})
    started = gevent.get_hub().loop.now()
    poller.work_once()
    poller.work_once()
    assert seen == [("ok", None, True), ("err: KeyError: 'x'", "KeyError", True)]
    # Two pauses of 0.3 s happened (a generous lower bound, no upper one).
    assert gevent.get_hub().loop.now() - started >= 0.5


def test_a_throttle_that_raises_does_not_stop_the_queue(db, sentry_events):
    poller = make_poller("q", db, {"q.N": lambda job: "ok"}, throttle=lambda s, e, t: 1 / 0)
    insert(db, "q", "q.N")
    insert(db, "q", "q.N")
    assert poller.work_once() == "ok" and poller.work_once() == "ok"
    assert len(sentry_events) == 2


@pytest.mark.parametrize(
    "kwargs",
    [{"job_timeout": 0}, {"poll_interval": -1}, {"concurrency": 0}, {"max_attempts": 0}, {"throttle": 5}],
)
def test_bad_configuration_fails_at_construction(db, kwargs):
    with pytest.raises(ValueError):
        make_poller("q", db, {"q.N": lambda job: "ok"}, **kwargs)
    with pytest.raises(ValueError):
        make_poller("q", db, {})


def _noting_cursor(sent: list) -> type:
    """A real cursor class that notes each statement it sends: one execute is
    one round trip to the server, however many statements its text holds."""

    class Noting(psycopg2.extensions.cursor):
        def execute(self, query, vars=None):
            sent.append(query)
            return super().execute(query, vars)

    return Noting


def test_outcome_and_next_claim_go_in_one_round_trip(database_url, db):
    """In the loop, a job's outcome is written together with the claim of the
    next job: one round trip and one transaction per job, not two. The jobs
    still run one at a time, in order."""
    # Which transaction wrote each status change, noted by the server itself.
    db.exec("CREATE TABLE status_writes (xid xid8, id bigint, status text)")
    db.exec(
        "CREATE OR REPLACE FUNCTION note_status() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "INSERT INTO status_writes VALUES (pg_current_xact_id(), NEW.id, NEW.status); RETURN NULL; END $$"
    )
    db.exec("CREATE TRIGGER note_status AFTER UPDATE OF status ON jobs FOR EACH ROW EXECUTE FUNCTION note_status()")
    n = 20
    ids = [insert(db, "q", "q.N") for _ in range(n)]
    # A pool of one connection, so every statement of the poller goes through its noting cursors.
    pool = DB(database_url, size=1)
    sent: list = []
    noting = _noting_cursor(sent)
    with pool.connection() as conn:
        conn.cursor_factory = noting
    order = []
    poller = make_poller("q", pool, {"q.N": lambda job: order.append(job.id) or "ok"}, poll_interval=60)
    try:
        # Done when the last outcome is committed; the poller then idles with nothing sent.
        poll_until([poller], lambda: count_jobs(db, "status = 'ok'") == n)
        with pool.connection() as conn:
            # Still the noting connection: none was replaced by one sending unnoted.
            still_noting = conn.cursor_factory is noting
        writes = {(job_id, status): xid for xid, job_id, status in db.query("SELECT * FROM status_writes")}
    finally:
        db.exec("DROP TRIGGER note_status ON jobs")
        db.exec("DROP TABLE status_writes")
        pool.close()
    assert order == ids
    # Each job's outcome and the next job's claim were one transaction.
    assert all(writes[(a, "ok")] == writes[(b, "started")] for a, b in itertools.pairwise(ids)), writes
    # n jobs cost n round trips and a fixed few (the first claim, preparing
    # the named statements once on the connection), not 2n.
    assert still_noting
    assert len(sent) <= n + 4, sent


def test_when_the_claim_sent_with_an_outcome_fails_the_outcome_is_written_alone(db):
    poller = make_poller("q", db, {"q.N": lambda job: "ok"})
    first, second = insert(db, "q", "q.N"), insert(db, "q", "q.N")
    job = poller.claim()
    # A lease the server cannot add to now(): the claim half fails with a real
    # server error and takes the whole transaction with it.
    poller.leases.lease = 1e300
    status, looked = poller.work(job, slot=0, wakeup=Event())
    assert (status, looked) == ("ok", None)  # the write went alone, and did not look
    assert dict(db.query("SELECT id, status FROM jobs")) == {first: "ok", second: "pending"}


def test_a_claimed_job_that_never_ran_is_given_back(db):
    poller = make_poller("q", db, {"q.N": lambda job: "ok"}, max_attempts=2)
    job_id = insert(db, "q", "q.N")
    job = poller.claim()
    poller.releaser.release(job)
    assert db.query_row("SELECT status, attempts, worker_id, slot FROM jobs WHERE id = %s", (job_id,)) == (
        "pending",
        0,
        None,
        None,
    )
    assert poller.work_once() == "ok"


def test_racing_claimers_keep_fifo(db, database_url):
    """Worker a locks the queue's head and is held before its claim lands (a
    trigger waits on a gate the test owns, standing in for the scheduler);
    worker b, another process claiming meanwhile, must not take the next row
    and run it first: it finds the queue's turn taken and claims nothing."""
    db.exec(
        "CREATE OR REPLACE FUNCTION slow_a() RETURNS trigger LANGUAGE plpgsql AS $$ "
        f"BEGIN IF NEW.worker_id = 'a' THEN PERFORM pg_advisory_xact_lock_shared({GATE}); END IF; RETURN NEW; END $$"
    )
    db.exec("CREATE TRIGGER slow_a BEFORE UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION slow_a()")
    try:
        head, second = insert(db, "q", "q.N"), insert(db, "q", "q.N")
        other = DB(database_url, size=2)
        a = make_poller("q", db, {"q.N": lambda job: "ok"}, runtime=Runtime.alone(db, worker_id="a"))
        b = make_poller("q", other, {"q.N": lambda job: "ok"}, runtime=Runtime.alone(other, worker_id="b"))
        with Gate(database_url, GATE) as gate, gevent.Timeout(20):
            claiming_a = gevent.spawn(a.claim)
            # a waits at the gate inside its update: it holds the head's row lock now.
            wait_for(lambda: waiting_on(db, "advisory"))
            # b neither waits behind a nor takes the row after a's.
            assert b.steps.claim(None, 0) == (None, 0.05)
            gate.open()
            assert claiming_a.get().id == head
        assert dict(db.query("SELECT id, status FROM jobs")) == {head: "started", second: "pending"}
    finally:
        db.exec("DROP TRIGGER slow_a ON jobs")
        other.close()


def test_a_job_longer_than_its_lease_is_never_rescued_while_it_runs(db):
    """Lease 3 s, job 4.5 s: the heartbeat renews it, another process's rescue
    passes it over, and the outcome is written."""
    poller = make_poller(
        "long", db, {"long.N": lambda job: gevent.sleep(4.5) or "ok"}, runtime=Runtime.alone(db, lease=3.0)
    )
    mine = poller.leases
    elsewhere = Leases(db, worker_id="another-process")
    job_id = insert(db, "long", "long.N")
    stop = Event()
    keeper = gevent.spawn(mine.run, stop)
    runner = gevent.spawn(poller.work_once)
    rescued = []
    try:
        for _ in range(20):
            gevent.sleep(0.25)
            rescued += elsewhere.rescue()
        assert runner.get(timeout=10) == "ok"
    finally:
        stop.set()
        keeper.kill()
    assert rescued == []
    assert db.query_row("SELECT status, lease_until FROM jobs WHERE id = %s", (job_id,)) == ("ok", None)
    # A finished row carries no lease, so no later rescue can touch it.
    db.exec("UPDATE jobs SET started_at = now() - interval '1 day' WHERE id = %s", (job_id,))
    assert elsewhere.rescue(legacy_age=0) == []


def record_batches(poller: Poller) -> list[str]:
    """What each of the poller's group commits carried, as it goes to the server."""
    sent: list[str] = []
    round_trip = poller.completer._round_trip

    def recording(asks):
        outcomes = ["finalize"] * sum(a.outcome is not None for a in asks)
        sent.append("+".join(outcomes + ["claim"] * sum(a.claim is not None for a in asks)))
        return round_trip(asks)

    poller.completer._round_trip = recording
    return sent


def test_a_lone_job_costs_two_round_trips(database_url, db):
    """Woken for one job: one claim, then its outcome written with a look for
    the next one, which finds none; the poller then sleeps without claiming again."""
    pool = DB(database_url, size=2)
    # The fallback polls of all queues fall on the monotonic clock's multiples
    # of poll_interval: at 60 s, one of them landed within this test's second
    # about once in a hundred runs, and claimed again. At a day, practically never.
    poller = make_poller("lone", pool, {"lone.N": lambda job: "ok"}, poll_interval=86400)
    sent = record_batches(poller)
    stop = Event()
    g = gevent.spawn(poller.poll, stop)
    try:
        gevent.sleep(0.2)
        assert sent == ["claim"]  # found nothing at start
        insert(db, "lone", "lone.N")
        poller.wake()
        with gevent.Timeout(10):
            while count_jobs(db, "status = 'ok'") < 1:
                gevent.sleep(0.02)
        gevent.sleep(0.3)
        assert sent == ["claim", "claim", "finalize+claim"]
    finally:
        stop.set()
        poller.wake()
        g.get(timeout=10)
        pool.close()


def test_a_snooze_that_holds_the_queue_gates_it_in_every_process_with_the_job_first(db):
    """A handler's Snooze(hold_queue=True), on a queue with no throttle: the
    job stays pending in its place, the queue's gate closes for the snooze's
    seconds (no poller of any process claims meanwhile), and the job is the
    queue's next claim once the gate opens."""
    from lib.job import Snooze

    def limited(job):
        raise Snooze(30, "skip: the API's key is spent", hold_queue=True)

    first = insert(db, "held", "held.N")
    second = insert(db, "held", "held.N")
    run_at = db.query_row("SELECT run_at FROM jobs WHERE id = %s", (first,))[0]
    stopped = Event()
    stopped.set()  # no local wait: the gate is what is looked at
    assert make_poller("held", db, {"held.N": limited}).work_once(stop=stopped) == "skip: the API's key is spent"
    assert db.query_row("SELECT status, run_at, attempts FROM jobs WHERE id = %s", (first,)) == ("pending", run_at, 1)
    (wait,) = db.query_row("SELECT extract(EPOCH FROM next_claim_at - now()) FROM job_queues WHERE queue = 'held'")
    assert 25 < wait <= 30
    other = make_poller("held", db, {"held.N": lambda job: "ok"})  # another process's
    assert other.claim() is None
    db.exec("UPDATE job_queues SET next_claim_at = NULL")  # the reset comes
    assert other.claim().id == first and second > first
