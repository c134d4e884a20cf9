import logging

import gevent
from gevent.event import Event
from proxy import Proxy
from tests_support import count_jobs, make_poller, read_until, start_worker, wait_for

from lib.insert import insert
from lib.run.runtime import Runtime
from lib.setup.error_reports import Outage
from lib.store.db import DB


def _wait_for(predicate, timeout: float = 20.0) -> None:
    with gevent.Timeout(timeout):
        while not predicate():
            gevent.sleep(0.02)


def test_unreachable_database_is_one_event_for_the_whole_outage(database_url, db, sentry_events, caplog):
    """Three pollers behind a proxy that goes down for a while: they keep
    failing, one event is sent, and they work again when it comes back."""
    proxy = Proxy(database_url)
    pool = DB.connect(proxy.url, size=4, checkout_timeout=2)
    outage = Outage("fetch pending jobs")
    runtime = Runtime.alone(pool, outage=outage)
    done = []
    pollers = [
        make_poller(q, pool, {f"{q}.N": lambda job: done.append(job.id) or "ok"}, poll_interval=0.1, runtime=runtime)
        for q in ("a", "b", "c")
    ]
    stop = Event()
    greenlets = [gevent.spawn(p.poll, stop) for p in pollers]
    try:
        for q in ("a", "b", "c"):
            insert(db, q, f"{q}.N")
        # All three work through the proxy, and no outcome write is still
        # waiting for its answer: a write cut off by the outage would be a
        # failure of its own (reported apart) and hold its queue's slot.
        _wait_for(lambda: count_jobs(db, "status = 'ok'") == 3 and not any(p.running for p in pollers))
        proxy.down()
        with caplog.at_level(logging.WARNING):
            # Every poller fails several cycles (the first retry comes after 1 s).
            _wait_for(lambda: outage._failures >= 6)
            proxy.up()
            for q in ("a", "b", "c"):
                insert(db, q, f"{q}.N")
            _wait_for(lambda: len(done) == 6)
    finally:
        stop.set()
        for p in pollers:
            p.wake()
        gevent.joinall(greenlets, timeout=10)
        proxy.close()
        pool.close()
    assert len(sentry_events) == 1
    assert "fetch pending jobs failing" in repr(sentry_events[0])
    assert any("recovered after" in r.getMessage() for r in caplog.records)
    assert count_jobs(db, "status = 'ok'") == 6


def test_two_outages_are_two_events(sentry_events):
    outage = Outage("fetch")
    for _ in range(5):
        outage.failed(OSError("down"))
    outage.recovered()
    outage.failed(OSError("down again"))
    outage.recovered()
    assert len(sentry_events) == 2


def test_a_worker_started_while_the_database_is_down_waits_for_it(db, database_url):
    """The worker process starts behind a proxy that refuses it, keeps trying,
    and works once the database answers."""
    db.exec(
        "CREATE TABLE IF NOT EXISTS probe_runs (job_id bigint, event text, at timestamptz DEFAULT clock_timestamp())"
    )
    proxy = Proxy(database_url)
    proxy.down()
    proc = start_worker(proxy.url)
    try:
        # Refused once, it says so and keeps trying (the next try is a second later).
        before = read_until(proc, "database at start failing")
        assert proc.poll() is None, before
        proxy.up()
        job_id = insert(db, "probe", "probe.Sleep", {"seconds": 0})
        wait_for(lambda: count_jobs(db, f"id = {job_id} AND status = 'ok'") == 1, timeout=60)
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proxy.close()
    assert proc.returncode == 0, before + out
    assert "database at start recovered" in out
