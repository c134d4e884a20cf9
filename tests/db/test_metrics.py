"""/metrics, read back with prometheus-client's own parser: the per-queue
gauges against the rows written, this process's counters against the jobs it
ran, and the one scrape query on its indexes with a million finished rows."""

import re
from datetime import UTC, datetime, timedelta

import gevent
import psycopg2
import pytest
import requests
from factory import ago, later, make_job, make_jobs
from gevent.event import Event
from http_support import serving
from prometheus_client.parser import text_string_to_metric_families
from proxy import Proxy
from tests_support import make_poller, wait_for

from lib.background.leases import Leases
from lib.greenlets.supervise import Supervisor
from lib.http import metrics
from lib.http.health import Health
from lib.http.httpd import make_app
from lib.insert import insert
from lib.job import Snooze
from lib.operate import overview
from lib.operate.queue_state import pause
from lib.store.db import DB
from lib.store.driver_errors import is_conn_failure
from lib.store.sql import STATEMENTS, Q, statement
from lib.store.wakeups import Listener


def scrape(base: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape, by name and labels, as Prometheus would read it."""
    answer = requests.get(f"{base}/metrics", timeout=10)
    assert answer.status_code == 200
    assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
    }


def value(samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


class Recording:
    """The pool, with every statement it is handed noted: what a scrape sends."""

    def __init__(self, db: DB) -> None:
        self.db = db
        self.sent: list[str] = []

    def query(self, sql, params=None):
        self.sent.append(sql)
        return self.db.query(sql, params)


def test_each_queue_gauge_matches_the_rows_written(db):
    make_jobs(db, 3, "mail", run_at=ago(seconds=120))
    make_job(db, "mail", run_at=ago(seconds=5))
    make_jobs(db, 2, "mail", run_at=later(hours=1))  # delayed: pending, not due
    make_job(db, "mail", status="started", worker_id="w", slot=0, lease_until=later(seconds=30))
    make_jobs(db, 4, "mail", status="ok")  # finished: in no gauge
    make_jobs(db, 2, "sms", status="started", worker_id="w", slot=[1, 2], lease_until=later())
    pause(db, "sms", "vendor outage")
    pause(db, "old", "over", until=datetime.now(UTC) - timedelta(minutes=1))  # a pause that has ended
    registry = metrics.registry(db, stats=overview.queue_stats, queues=["idle"])
    with serving(make_app(Health(db), registry)) as base:
        got = scrape(base)
    assert value(got, "jobs_queue_stats_up") == 1
    assert value(got, "jobs_queue_pending", queue="mail") == 6
    assert value(got, "jobs_queue_due", queue="mail") == 4
    assert value(got, "jobs_queue_running", queue="mail") == 1
    assert 120 <= value(got, "jobs_queue_oldest_due_age_seconds", queue="mail") < 180
    assert value(got, "jobs_queue_paused", queue="mail") == 0
    assert value(got, "jobs_queue_running", queue="sms") == 2
    assert value(got, "jobs_queue_pending", queue="sms") == 0
    assert value(got, "jobs_queue_oldest_due_age_seconds", queue="sms") == 0
    assert value(got, "jobs_queue_paused", queue="sms") == 1
    assert value(got, "jobs_queue_paused", queue="old") == 0
    # A queue this worker runs is there with zeros before it has a row.
    assert ("jobs_queue_pending", (("queue", "idle"),)) in got
    assert {labels for name, labels in got if name == "jobs_queue_pending"} == {
        (("queue", q),) for q in ("idle", "mail", "old", "sms")
    }


def test_the_queue_gauges_cost_one_query_per_scrape_and_are_kept_a_few_seconds(db):
    make_job(db, "q")
    recording = Recording(db)
    now = [1000.0]
    collector = metrics.QueueCollector(recording, overview.queue_stats, ["q"], ttl=5.0, clock=lambda: now[0])
    registry = metrics.registry()
    registry.register(collector)
    with serving(make_app(Health(db), registry)) as base:
        assert value(scrape(base), "jobs_queue_pending", queue="q") == 1
        make_job(db, "q")
        now[0] += 4.9
        # Scrapes that come together, and any within the TTL, share the answer.
        scrapes = [gevent.spawn(scrape, base) for _ in range(5)]
        gevent.joinall(scrapes, raise_error=True)
        assert {value(s.value, "jobs_queue_pending", queue="q") for s in scrapes} == {1}
        now[0] += 0.2
        assert value(scrape(base), "jobs_queue_pending", queue="q") == 2
    assert recording.sent == [Q.queue_stats, Q.queue_stats]


def test_a_scrape_while_the_database_is_down_still_answers_with_the_process_metrics(database_url):
    proxy = Proxy(database_url)
    db = DB.connect(proxy.url, size=2, connect_timeout=2)
    try:
        collector = metrics.QueueCollector(db, overview.queue_stats, ["q"], ttl=0, conn_failure=is_conn_failure)
        registry = metrics.registry(db)
        registry.register(collector)
        with serving(make_app(Health(db), registry)) as base:
            assert value(scrape(base), "jobs_queue_stats_up") == 1
            proxy.down()
            got = scrape(base)
            assert value(got, "jobs_queue_stats_up") == 0
            assert not [name for name, _ in got if name.startswith("jobs_queue_") and name != "jobs_queue_stats_up"]
            assert value(got, "jobs_pool_size") == 2
            # A lost connection is the database's outage (shared with the worker), not a fault of the scrape.
            assert collector.outage._failures and not collector.fault._failures
            proxy.up()
            wait_for(lambda: value(scrape(base), "jobs_queue_stats_up") == 1, 20)
            assert not collector.outage._failures
    finally:
        db.close()
        proxy.close()


def _fails(job):
    raise RuntimeError("boom")


def _snoozes(job):
    raise Snooze(60, "skip: rate limited")


def test_this_processes_counters_follow_the_jobs_it_ran(db):
    handlers = {
        "c.Ok": lambda job: "ok: done",
        "c.Fail": lambda job: "fail: no such user",
        "c.Skip": lambda job: "skip: nothing to do",
        "c.Err": _fails,
        "c.Snooze": _snoozes,
    }
    poller = make_poller("counted", db, handlers)
    registry = metrics.registry(db)
    with serving(make_app(Health(db), registry)) as base:
        before = scrape(base)
        for name in handlers:
            insert(db, "counted", name, {})
        insert(db, "counted", "c.Err", {"again": True}, max_attempts=2)  # its first failure is a retry
        while poller.work_once() is not None:
            pass
        after = scrape(base)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert {k: delta("jobs_finished_total", queue="counted", kind=k) for k in ("ok", "fail", "skip", "err")} == {
        "ok": 1,
        "fail": 1,
        "skip": 1,
        "err": 1,
    }
    assert delta("jobs_retries_total", queue="counted") == 1
    assert delta("jobs_snoozes_total", queue="counted") == 1
    # Every attempt is timed: six of them, the retry and the snooze included.
    assert delta("jobs_duration_seconds_count", queue="counted") == 6
    assert delta("jobs_duration_seconds_bucket", queue="counted", le="+Inf") == 6
    assert delta("jobs_pool_checkout_wait_seconds_count") > 0


def test_the_group_commits_round_trips_and_asks_are_counted(db):
    """Each outcome and claim sent is an ask, and a round trip carries one or
    more: both counted from the group commit of the worker's pollers."""
    poller = make_poller("grouped", db, {"grouped.N": lambda job: "ok"})
    registry = metrics.registry(db, committer=poller.completer)
    with serving(make_app(Health(db), registry)) as base:
        before = scrape(base)
        for _ in range(3):
            insert(db, "grouped", "grouped.N", {})
        while poller.work_once() is not None:
            pass
        after = scrape(base)

    def delta(name: str) -> float:
        return value(after, name) - value(before, name)

    # Three outcomes, and the claims before them.
    assert delta("jobs_group_commit_asks_total") >= 6
    assert 0 < delta("jobs_group_commit_round_trips_total") <= delta("jobs_group_commit_asks_total")
    assert value(after, "jobs_group_commit_asks_total") == poller.completer.asks


def test_rescues_restarts_pool_and_listener(db, database_url):
    make_jobs(db, 2, "lost", status="started", worker_id="gone", slot=[1, 2], lease_until=ago(minutes=1))
    stop = Event()
    supervisor = Supervisor(stop, first_delay=0.01)
    deaths = []

    def dies_twice(stop_: Event) -> None:
        if len(deaths) < 2:
            deaths.append(1)
            raise RuntimeError("a bug")
        stop_.wait()

    listener = Listener(database_url, wake=lambda queue: None, wake_all=lambda: None)
    registry = metrics.registry(db, listener=listener, supervisor=supervisor)
    with serving(make_app(Health(db), registry)) as base:
        before = scrape(base)
        assert value(before, "jobs_listener_connected") == 0
        assert value(before, "jobs_pool_size") == db.size == 8
        Leases(db).rescue()
        supervisor.spawn("flaky", dies_twice)
        supervisor.spawn("listener", listener.run)
        try:
            wait_for(lambda: supervisor.restarts["flaky"] == 2 and listener.listening.is_set(), 10)
            with db.connection():  # one connection checked out while the scrape reads the pool
                during = scrape(base)
        finally:
            stop.set()
            gevent.killall(list(supervisor.greenlets.values()))
    assert value(during, "jobs_rescues_total", queue="lost") - value(before, "jobs_rescues_total", queue="lost") == 2
    assert value(during, "jobs_part_restarts_total", part="flaky") == 2
    assert value(during, "jobs_part_restarts_total", part="listener") == 0
    assert value(during, "jobs_listener_connected") == 1
    # The scrape's own queries use the pool too; the held one is always there.
    assert value(during, "jobs_pool_in_use") >= 1
    assert db.in_use == 0


def test_the_scrape_query_stays_on_indexes_with_a_million_finished_rows(db, admin_db, database_url):
    """A scrape with a million finished rows kept: it sends one statement,
    and that statement, in the generic plan the pool's prepared statement
    settles on, reads no table of jobs from end to end and touches a few
    hundred pages at most. The failures lists (the admin page's, the failed
    command's) ride along (the million rows take most of this test's 6 s):
    planned for their values as the pool sends them, they read the failures
    of the queue and name asked for, or the newest up to the limit: a few
    pages, where reading the 100,000 failures kept would touch thousands."""
    with admin_db.connection() as conn, conn.cursor() as cur:
        # No per-row triggers (the wakeup notify): not what this test is about, and they triple the insert time.
        # dedupe is named: the trigger that fills it in when left out runs even here (sql/rules/triggers.sql).
        cur.execute("SET session_replication_role = replica")
        cur.execute(
            "INSERT INTO jobs (queue, name, status, finished_at, attempts, dedupe) "
            "SELECT 'q' || (i % 20), 'q.N', CASE WHEN i % 10 = 0 THEN 'err: x' ELSE 'ok' END, "
            "now() - interval '2 days' - i * interval '1 second', 1, false "
            "FROM generate_series(1, 1000000) AS i"
        )
        cur.execute("SET session_replication_role = DEFAULT")
    make_jobs(db, 3, "q1")
    make_job(db, "q1", status="ok")
    db.exec("ANALYZE jobs")
    recording = Recording(db)
    registry = metrics.registry()
    registry.register(metrics.QueueCollector(recording, overview.queue_stats, ["q1"]))
    with serving(make_app(Health(db), registry)) as base:
        assert value(scrape(base), "jobs_queue_pending", queue="q1") == 3
    assert len(recording.sent) == 1
    plan = _generic_plan(database_url, recording.sent[0], {"queues": ["q1"], "rows": None})
    assert "Seq Scan on jobs" not in plan, plan
    assert "jobs_finished" in plan, plan
    hit = int(plan.split("Buffers: shared hit=")[1].split()[0].split(",")[0])
    assert hit < 500, plan
    filters = [{"queue": None, "name": None}, {"queue": "q1", "name": "q1.N"}, {"queue": "q0", "name": "q.N"}]
    for sql, more in ((Q.job_failed_list, {}), (Q.job_failed, {"ids": None, "since": None})):
        for given in filters:
            plan = _plan_as_sent(db, sql, {**given, **more, "limit": 100})
            assert "Seq Scan on jobs" not in plan, plan
            assert _buffers(plan) < 100, plan


def _plan_as_sent(db: DB, sql: str, params: dict) -> str:
    """EXPLAIN ANALYZE of a query the pool sends with its values written in."""
    assert sql not in STATEMENTS
    with db.connection() as conn, conn.cursor() as cur:
        cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + cur.mogrify(sql, params).decode())
        return "\n".join(row[0] for row in cur.fetchall())


def _buffers(plan: str) -> int:
    """The pages the whole statement touched: its top node's buffers."""
    counts = plan.split("Buffers: ", 1)[1].splitlines()[0]
    return sum(int(n) for n in re.findall(r"(?:hit|read)=(\d+)", counts))


def _generic_plan(database_url: str, sql: str, params: dict) -> str:
    """EXPLAIN ANALYZE of sql as the pool runs it: prepared, in the generic
    plan Postgres keeps after a few runs (forced here rather than waited for)."""
    stmt = statement("scrape_explained", sql)
    conn = psycopg2.connect(database_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SET plan_cache_mode = force_generic_plan")
            cur.execute(stmt.prepare)
            cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + stmt.execute, [params[name] for name in stmt.params])
            return "\n".join(row[0] for row in cur.fetchall())
    finally:
        conn.close()


@pytest.mark.parametrize("bad", ["nonsense: status", ""])
def test_a_status_outside_the_vocabulary_is_counted_as_err_never_raised(bad):
    class Outcome:
        status = bad
        retry_in = None
        counted = True

    registry = metrics.registry()
    labels = {"queue": "odd", "kind": "err"}
    before = registry.get_sample_value("jobs_finished_total", labels) or 0.0
    metrics.job_done("odd", Outcome(), 0.1)
    assert registry.get_sample_value("jobs_finished_total", labels) == before + 1
