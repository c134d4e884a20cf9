"""Group commit, batched claims, the throttle across processes, and a pool as
small as the work. A process is stood for by a pool of its own: each pool has
its own runtime (Runtime.alone), so its own committer, as each worker
process has."""

import itertools
import time
from collections import Counter

import gevent
import psycopg2
import pytest
from gevent.event import Event
from tests_support import count_jobs, make_poller, poll_until, running_worker, updates_held, wait_for, waiting_on

import lib.run.steps
from lib.insert import Job, insert, insert_many
from lib.run.execute import Outcome
from lib.run.queue import Queue
from lib.run.runtime import Runtime
from lib.run.steps import Ask, lone_step
from lib.setup.settings import Settings
from lib.store.binding import array_text
from lib.store.db import DB
from lib.store.driver_errors import NoReply
from lib.store.wakeups import Listener

# The advisory lock key of this module's gate (tests_support.updates_held).
GATE = 7_100_011


@pytest.fixture
def other(database_url):
    """A second process's pool."""
    pool = DB(database_url, size=4, application_name="jobs-other")
    yield pool
    pool.close()


def test_a_throttling_outcome_in_flight_holds_back_another_process_claim(db, other, database_url):
    """The two-connection interleaving: A's outcome (throttle 0.5 s) is written
    but not committed; B claims meanwhile, A commits, B claims again. B never
    starts the next job before A's outcome plus the throttle."""
    a = make_poller("t", db, {"t.N": lambda job: "ok"}, runtime=Runtime.alone(db, worker_id="a"))
    b = make_poller("t", other, {"t.N": lambda job: "ok"}, runtime=Runtime.alone(other, worker_id="b"))
    first, second = insert(db, "t", "t.N"), insert(db, "t", "t.N")
    job = a.claim()
    assert job.id == first
    conn = psycopg2.connect(database_url)
    try:
        with conn.cursor() as cur:
            cur.execute(*lone_step(Ask(a.steps.outcome_params(job, Outcome("ok"), 0.5), None)))
            assert [row[2] for row in cur.fetchall()] == [job.id]  # written
            # A's outcome is in flight: B's claim neither waits for it nor passes the gate.
            assert b.steps.claim(None, 0) == (None, 0.05)
        conn.commit()
    finally:
        conn.close()
    looked, wait = b.steps.claim(None, 0)
    assert looked is None and 0.3 < wait <= 0.5
    wait_for(lambda: b.claim() is not None)
    gap = db.query_row(
        "SELECT extract(EPOCH FROM s.started_at - f.finished_at) FROM jobs f, jobs s WHERE f.id = %s AND s.id = %s",
        (first, second),
    )[0]
    assert gap >= 0.5


def test_the_throttle_holds_across_three_processes(db, database_url):
    """Three processes, each with its poller and its LISTEN connection, share
    one throttled queue. Each stops itself after three jobs, so eight jobs
    need all three whatever the scheduling: a process that stops hands the
    queue over, and the throttle's gap of 0.2 s holds across the hand-overs."""
    pools = [DB(database_url, size=3, application_name=f"jobs-p{n}") for n in range(3)]
    stops = [Event() for _ in pools]
    ran = Counter()

    def handler_of(n):
        def handle(job):
            ran[n] += 1
            if ran[n] == 3:
                stops[n].set()  # seen at the outcome: this process claims no more
            return "ok"

        return handle

    try:
        pollers = [
            make_poller(
                "t3",
                pool,
                {"t3.N": handler_of(n)},
                throttle=lambda *_: 0.2,
                runtime=Runtime.alone(pool, worker_id=f"p{n}"),
            )
            for n, pool in enumerate(pools)
        ]
        listeners = [Listener(database_url, lambda queue, p=p: p.wake(), p.wake) for p in pollers]
        heard = [gevent.spawn(listener.run, Event()) for listener in listeners]
        for listener in listeners:
            assert listener.listening.wait(10)
        for _ in range(8):
            insert(db, "t3", "t3.N")
        greenlets = [gevent.spawn(p.poll, stop) for p, stop in zip(pollers, stops, strict=True)]
        try:
            with gevent.Timeout(30):
                while count_jobs(db, "status = 'ok'") < 8:
                    gevent.sleep(0.02)
        finally:
            for p, stop in zip(pollers, stops, strict=True):
                stop.set()
                p.wake()
            gevent.joinall(greenlets, timeout=10, raise_error=True)
            gevent.killall(heard)
    finally:
        for pool in pools:
            pool.close()
    rows = db.query("SELECT started_at, finished_at, worker_id FROM jobs ORDER BY started_at")
    gaps = [(later[0] - earlier[1]).total_seconds() for earlier, later in itertools.pairwise(rows)]
    assert min(gaps) >= 0.2, gaps
    assert Counter(r[2] for r in rows) == {f"p{n}": ran[n] for n in range(3)}
    assert set(ran) == {0, 1, 2}  # every process ran jobs of the queue


def test_forty_queues_share_their_round_trips(db, runtime):
    pollers = [make_poller(f"g{n:02}", db, {"g.N": lambda job: "ok"}, runtime=runtime) for n in range(40)]
    for n in range(40):
        for _ in range(10):
            insert(db, f"g{n:02}", "g.N")
    commit = pollers[0].completer
    assert all(p.completer is commit for p in pollers)  # one committer per runtime: per process
    before_batches, before_asks = commit.batches, commit.asks
    poll_until(pollers, lambda: count_jobs(db, "status = 'ok'") == 400)
    batches, asks = commit.batches - before_batches, commit.asks - before_asks
    assert asks >= 400  # each job's outcome, and the claims
    # Each batch carried many queues' outcomes and claims: well under one
    # transaction a job (sent alone, each job would cost one or two).
    assert batches < 400 / 4, (batches, asks)


def test_a_queue_with_free_slots_claims_them_in_one_statement(db):
    started = []
    poller = make_poller(
        "c4", db, {"c4.N": lambda job: started.append(job.id) or gevent.sleep(0.2) or "ok"}, concurrency=4
    )
    ids = [insert(db, "c4", "c4.N") for _ in range(4)]
    poll_until([poller], lambda: count_jobs(db, "status = 'ok'") == 4)
    assert sorted(started) == ids
    # One transaction's now(): the four were claimed together.
    assert db.query_row("SELECT count(DISTINCT started_at) FROM jobs")[0] == 1
    assert db.query_row("SELECT count(DISTINCT slot) FROM jobs") == (0,)  # slots freed at the outcome


def test_the_database_holds_a_queue_to_its_concurrency_across_processes(db, other):
    live, peak = Counter(), Counter()

    def handler(job):
        live["n"] += 1
        peak["n"] = max(peak["n"], live["n"])
        gevent.sleep(0.05)
        live["n"] -= 1
        return "ok"

    a = make_poller("c2", db, {"c2.N": handler}, concurrency=2, runtime=Runtime.alone(db, worker_id="a"))
    b = make_poller("c2", other, {"c2.N": handler}, concurrency=2, runtime=Runtime.alone(other, worker_id="b"))
    for _ in range(30):
        insert(db, "c2", "c2.N")

    def done() -> bool:
        b.wake()  # as another enqueue's notification would: b keeps asking for the queue's slots
        return count_jobs(db, "status = 'ok'") == 30

    poll_until([a, b], done)
    assert peak["n"] == 2
    assert b.completer.asks > 10


def test_a_held_head_row_is_never_passed_over(db, database_url):
    poller = make_poller("f", db, {"f.N": lambda job: "ok"})
    head, second = insert(db, "f", "f.N"), insert(db, "f", "f.N")
    conn = psycopg2.connect(database_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM jobs WHERE id = %s FOR UPDATE", (head,))
            assert poller.steps.claim(None, 0) == (None, 0.05)  # look again shortly; job 2 stays
            assert db.query_row("SELECT status FROM jobs WHERE id = %s", (second,)) == ("pending",)
        conn.rollback()  # answered once the lock is gone, which a close is not
    finally:
        conn.close()
    assert poller.claim().id == head


def test_idle_connections_close(database_url):
    pool = DB(database_url, size=5, idle_timeout=0.3, application_name="jobs-idle-pool")
    try:
        gevent.joinall([gevent.spawn(pool.query_row, "SELECT pg_sleep(0.1)") for _ in range(5)], raise_error=True)
        opened = "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'jobs-idle-pool'"
        assert pool.query_row(opened) == (5,)  # the five stay open while in use lately
        time.sleep(0.4)
        # The one asking: the next checkout closes the idle four, and their
        # server processes end a moment after (pg_stat_activity lists them till then).
        wait_for(lambda: pool.query_row(opened) == (1,))
    finally:
        pool.close()


def test_handlers_holding_every_connection_do_not_hold_up_outcomes(db, database_url):
    pool = DB(database_url, size=1, checkout_timeout=5)
    runtime = Runtime.alone(pool)
    release = Event()

    def holding(job):
        with pool.connection():
            release.wait()
        return "ok"

    hold = make_poller("hold", pool, {"hold.N": holding}, runtime=runtime)
    quick = make_poller("quick", pool, {"quick.N": lambda job: "ok"}, runtime=runtime)
    insert(db, "hold", "hold.N")
    stop = Event()
    greenlets = [gevent.spawn(hold.poll, stop)]
    try:
        wait_for(lambda: pool.in_use == 1 and count_jobs(db, "status = 'started'") == 1)
        for _ in range(3):
            insert(db, "quick", "quick.N")
        greenlets.append(gevent.spawn(quick.poll, stop))
        # Every job of the other queue claimed and finished while the handler
        # holds the pool's only connection.
        wait_for(lambda: count_jobs(db, "queue = 'quick' AND status = 'ok'") == 3)
        assert pool.in_use >= 1 and not release.is_set()
    finally:
        release.set()
        stop.set()
        hold.wake()
        quick.wake()
        gevent.joinall(greenlets, timeout=10, raise_error=True)
        pool.close()
    assert count_jobs(db, "status = 'ok'") == 4


def test_an_idle_forty_queue_worker_holds_at_most_three_connections(db, database_url):
    pool = DB(database_url, size=44, idle_timeout=0.5, application_name="jobs-worker-test")
    registry = [lambda d, n=n: Queue(f"i{n:02}", {"i.N": lambda job: "ok"}) for n in range(40)]
    for n in range(40):
        insert(db, f"i{n:02}", "i.N")
    held = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name <> 'jobs-test'"
    )
    try:
        with running_worker(pool, registry, Settings(http_addr=None, shutdown_window=5)):
            wait_for(lambda: count_jobs(db, "status = 'ok'") == 40)
            # Busy a moment ago; idle now.
            wait_for(lambda: db.query_row(held)[0] <= 3, timeout=10)
            gevent.sleep(1.5)
            assert db.query_row(held)[0] <= 3
    finally:
        pool.close()


def test_a_fault_in_the_committer_reaches_its_asks_and_the_next_batch_goes_on(db, caplog):
    poller = make_poller("bug", db, {"bug.N": lambda job: "ok"})
    insert(db, "bug", "bug.N")
    answer = poller.completer._round_trip
    poller.completer._round_trip = lambda asks: [("bug",)]  # a row the batch's answers cannot be read from
    with pytest.raises(IndexError), gevent.Timeout(10):
        poller.claim()
    assert "group commit failed" in caplog.text
    poller.completer._round_trip = answer
    assert poller.claim() is not None


def calls_of(obj, name):
    """Wrap obj's method name: the (greenlet, args) of each call from now on."""
    calls = []
    method = getattr(obj, name)

    def noted(*args):
        calls.append((gevent.getcurrent(), args))
        return method(*args)

    setattr(obj, name, noted)
    return calls


def test_a_serial_queue_sends_each_outcome_from_its_slot_without_the_sender(db):
    """Batches of one ask each (a serial queue): a job's outcome, with the
    slot's next claim, goes from the slot's own greenlet, the one that ran
    the job, with no hop to the sender or any other greenlet and back."""
    poller = make_poller("s", db, {"s.N": lambda job: "ok"})
    for _ in range(20):
        insert(db, "s", "s.N")
    batches = calls_of(poller.completer, "_commit")
    polling = calls_of(poller, "run_slot")
    poll_until([poller], lambda: count_jobs(db, "status = 'ok'") == 20)
    # The greenlet that sent each batch carrying an outcome: one a job, each alone.
    senders = [g for g, (asks,) in batches if any(ask.outcome is not None for ask in asks)]
    assert len(senders) == 20
    assert set(senders) == {g for g, _ in polling} and len(polling) == 1


def test_a_lone_outcome_cut_off_in_its_greenlet_leaves_the_committer_sending(db, database_url, monkeypatch):
    """A lone outcome goes from the greenlet that asked. Killed with its batch
    on the way (a trigger holds its update), that greenlet takes the
    batch down with it: the ask hears so, and the ask queued behind it still
    goes, with no sender left from before to find it, and so does the next."""
    monkeypatch.setattr(lib.run.steps, "LINGER", 0.05)
    poller = make_poller("cut", db, {"cut.N": lambda job: "ok"})
    first = insert(db, "cut", "cut.N")
    job = poller.claim()
    assert job is not None and job.id == first
    commit = poller.completer
    wait_for(lambda: commit._sender._greenlet.dead, timeout=5)
    batches = calls_of(commit, "_commit")
    with updates_held(db, database_url, GATE, f"NEW.id = {first} AND NEW.status = 'ok'"):
        writing = gevent.spawn(commit.send, poller.steps.outcome_params(job, Outcome("ok"), 0.0), None)
        wait_for(lambda: waiting_on(db, "advisory"), timeout=10)
        claiming = gevent.spawn(commit.send, None, poller.steps.params(None, 0))
        gevent.sleep(0)  # it queues behind the batch on its way
        assert not claiming.ready()
        writing.kill()
        (cut, (asks,)), *_ = batches
        assert cut is writing and isinstance(asks[0].reply.exception, NoReply)
        # The slot is still the first job's: the claim's answer is that it is taken.
        reply = claiming.get(timeout=10)
        assert reply.row is not None and reply.row[0] is None
        with gevent.Timeout(10):
            assert commit.send(None, poller.steps.params(None, 0)).row is not None


def test_asks_of_one_turn_go_together_from_a_sender_that_leaves_once_idle(db, runtime, monkeypatch):
    """Claims asked in the same turn of the hub (a queue's slots starting) go
    in one batch, sent by the sender; it waits a moment for the next batch
    instead of ending with each, and is gone once nothing has come for LINGER
    seconds. Once batches carry several asks, an outcome waits for the
    sender's turn too, so the outcomes of one turn go together."""
    monkeypatch.setattr(lib.run.steps, "LINGER", 0.5)
    pollers = [make_poller(f"t{n}", db, {"t.N": lambda job: "ok"}, runtime=runtime) for n in range(3)]
    for poller in pollers:
        insert(db, poller.queue, "t.N")
    batches = calls_of(pollers[0].completer, "_commit")

    def together(ask):
        asking = [gevent.spawn(ask, p) for p in pollers]
        gevent.joinall(asking, timeout=10, raise_error=True)
        return [g.value for g in asking]

    claimed = together(lambda p: p.claim())
    assert all(job is not None for job in claimed)
    together(lambda p: p.completer.send(p.steps.outcome_params(claimed[pollers.index(p)], Outcome("ok"), 0.0), None))
    assert [len(asks) for _, (asks,) in batches] == [3, 3]
    sender = batches[0][0]
    assert batches[1][0] is sender
    assert count_jobs(db, "status = 'ok'") == 3
    wait_for(lambda: sender.dead, timeout=5)
    # The next ask finds no sender and starts one: nothing waits for a sender that left.
    insert(db, "t0", "t.N")
    with gevent.Timeout(10):
        assert pollers[0].claim() is not None
    assert batches[-1][0] is not sender and not batches[-1][0].dead


def test_a_writer_that_makes_send_at_asks_sends_them_one_batch_on_its_way_at_a_time(db):
    """Under load (64 slots of no-op jobs) an outcome that makes SEND_AT
    asks waiting, with no batch on its way, goes at once from the writer that
    asked, with the asks before it, not on the sender's turn; the sender,
    asked before that, sends nothing beside it: one batch is on its way at a
    time, and every job ends once."""
    poller = make_poller("sa", db, {"sa.N": lambda job: "ok"}, concurrency=64)
    insert_many(db, [Job("sa", "sa.N") for _ in range(640)])
    commit = poller.completer
    batches = []  # (sent by the sender, asks carried, batches on their way then)
    on_the_way = []
    commit_batch = commit._commit

    def noted(asks):
        on_the_way.append(None)
        batches.append((gevent.getcurrent() is commit._sender._greenlet, len(asks), len(on_the_way)))
        try:
            return commit_batch(asks)
        finally:
            on_the_way.pop()

    commit._commit = noted
    poll_until([poller], lambda: count_jobs(db, "status = 'ok'") == 640)
    assert max(at_once for _, _, at_once in batches) == 1
    by_writers = [n for by_sender, n, _ in batches if not by_sender and n > 1]
    assert by_writers and min(by_writers) >= lib.run.steps.SEND_AT
    assert count_jobs(db, "status = 'ok' AND attempts = 1") == 640


def test_outcomes_of_many_queues_go_together_on_the_senders_turn(db, runtime):
    """Under load, 24 queues of one slot each: more than SEND_AT asks wait at
    once, but no queue has SEND_AT of them, so no writer sends for the others;
    every batch goes on the sender's turn, and every job ends once."""
    queues = [f"mq{i}" for i in range(24)]
    pollers = [make_poller(q, db, {"mq.N": lambda job: "ok"}, runtime=runtime) for q in queues]
    insert_many(db, [Job(q, "mq.N") for _ in range(20) for q in queues])
    commit = runtime.completer
    batches = []  # (sent by the sender, asks carried)
    commit_batch = commit._commit

    def noted(asks):
        batches.append((gevent.getcurrent() is commit._sender._greenlet, len(asks)))
        return commit_batch(asks)

    commit._commit = noted
    poll_until(pollers, lambda: count_jobs(db, "status = 'ok'") == 480)
    assert max(n for _, n in batches) > lib.run.steps.SEND_AT
    assert all(by_sender for by_sender, n in batches if n > 1)
    assert count_jobs(db, "status = 'ok' AND attempts = 1") == 480


def test_an_outcome_the_driver_cannot_send_fails_alone(db, runtime):
    """A NUL in one outcome's traceback: the driver refuses the whole batch's
    text; the batch goes again ask by ask, and only that outcome is replaced."""
    pollers = [make_poller(f"n{i}", db, {"n.N": lambda job: "ok"}, runtime=runtime) for i in range(3)]
    jobs = []
    for poller in pollers:
        insert(db, poller.queue, "n.N")
        jobs.append(poller.claim())
    bad = Outcome("err: boom", RuntimeError("boom"), traceback="line\x00 with a NUL")
    asks = [
        gevent.spawn(
            p.completer.send, p.steps.outcome_params(job, bad if p is pollers[0] else Outcome("ok"), 0.0), None
        )
        for p, job in zip(pollers, jobs, strict=True)
    ]
    gevent.joinall(asks, timeout=10)
    assert isinstance(asks[0].exception, ValueError)
    assert [a.value.written for a in asks[1:]] == [True, True]
    assert pollers[0].completer.batches >= 4  # the batch, then each ask alone


def test_a_batch_column_reaches_the_server_as_it_was(db):
    """The committer sends each column as one array text: every value,
    NULL and the text "NULL", quotes, backslashes, commas and braces among
    them, arrives as itself; a NUL is still the driver's ValueError."""
    texts = ['a"b', "c\\d", None, "", "x,y", "{}", "NULL", " padded ", "ünï\u2028"]
    floats = [0.0, -1.5, float("inf"), None, 1e-300, 30.0]
    ints = [1, None, 2**62, -7]
    row = db.query_row(
        "SELECT %(t)s::text[], %(f)s::float8[], %(i)s::bigint[], %(e)s::int[]",
        {"t": array_text(texts), "f": array_text(floats), "i": array_text(ints), "e": array_text([])},
    )
    assert row == (texts, floats, ints, [])
    with pytest.raises(ValueError):
        db.query_row("SELECT %(t)s::text[]", {"t": array_text(["a\x00b"])})
    with pytest.raises(TypeError):
        array_text([True])
