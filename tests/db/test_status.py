import pytest

from lib.job import status as st
from lib.store.sql import Q


def test_builders_and_reader_agree():
    assert st.kind(st.ok()) is st.Kind.OK
    assert st.kind(st.ok("3 rows")) is st.Kind.OK
    assert st.kind(st.fail("no match")) is st.Kind.FAIL
    assert st.kind(st.skip("nothing new")) is st.Kind.SKIP
    assert st.kind(st.err("boom")) is st.Kind.ERR
    assert st.kind(st.INTERRUPTED) is st.Kind.ERR
    assert st.kind("pending") is st.Kind.PENDING
    assert st.detail(st.fail("no  match\n here")) == "no match here"


@pytest.mark.parametrize("bad", ["", "done", "error: x", "fail:", "fail: ", "OK", "err:x"])
def test_reader_refuses_what_is_not_a_status(bad):
    with pytest.raises(ValueError):
        st.kind(bad)


def test_a_reason_is_required_and_length_is_bounded():
    with pytest.raises(ValueError):
        st.fail("  ")
    assert len(st.err("x" * 10_000)) == st.MAX_LEN


def test_every_status_the_sql_writes_parses():
    # The literal statuses in the named queries and migrations must be in the vocabulary.
    import re

    from lib.store.sql import SQL_DIR

    texts = [*(getattr(Q, n) for n in Q.names()), *(p.read_text() for p in (SQL_DIR / "migrations").glob("*.sql"))]
    literals = set()
    for text in texts:
        for match in re.finditer(r"status\s*(?:=|<>|IN\s*\(|THEN|ELSE)\s*'([^']+)'", text):
            literals.add(match.group(1))
        literals.update(re.findall(r"(?:THEN|ELSE) '([^']+)'", text))
    assert {"pending", "started", "err: interrupted"} <= literals
    for literal in literals:
        st.kind(literal)


def test_every_status_the_code_writes_parses(db):
    """Drive each writer of a status (the claim, every kind of outcome, a
    retry, a snooze, a killed job, the rescue, a redrive), then
    read back every status and last_error in the table: each one must parse,
    and between them they must cover every kind, so no writer was left out."""
    import gevent
    from gevent.event import Event
    from tests_support import make_poller

    from lib.background.leases import Leases
    from lib.insert import insert
    from lib.job import Snooze
    from lib.operate.redrive import redrive

    hanging = Event()

    def raises(job):
        raise RuntimeError("vendor said no")

    def hangs(job):
        hanging.set()
        gevent.sleep(60)
        return "ok"

    def snoozes(job):
        raise Snooze(60, st.rate_limited(60, "429 from the vendor"))

    dispatch = {
        "q.Ok": lambda job: st.ok(),
        "q.OkDetail": lambda job: st.ok("3 rows"),
        "q.Fail": lambda job: st.fail("no match"),
        "q.Skip": lambda job: st.skip("nothing new"),
        "q.Raise": raises,
        "q.Slow": lambda job: gevent.sleep(60) or "ok",
        "q.Bad": lambda job: "done",
        "q.Snooze": snoozes,
    }
    poller = make_poller("q", db, dispatch, job_timeout=0.2, max_attempts=1)
    for name in [*dispatch, "q.Unknown"]:
        insert(db, "q", name)
    insert(db, "q", "q.Raise", {"retry": True}, max_attempts=2)
    while poller.work_once() is not None:
        pass
    # Killed while it runs (the shutdown window closed): written off as interrupted.
    insert(db, "k", "k.Hang", max_attempts=1)
    killed = gevent.spawn(make_poller("k", db, {"k.Hang": hangs}).work_once)
    assert hanging.wait(10)
    killed.kill()
    # Rescued from a lost worker, with attempts left and without.
    for max_attempts in (1, 2):
        insert(db, f"r{max_attempts}", "r.N", max_attempts=max_attempts)
        make_poller(f"r{max_attempts}", db, {"r.N": lambda job: "ok"}).claim()
    db.exec("UPDATE jobs SET lease_until = now() - interval '1 second' WHERE queue LIKE 'r_'")
    assert len(Leases(db).rescue()) == 2
    # Redriven after a fault, and one row left started and one pending.
    assert len(redrive(db, queue="q", name="q.Bad").redriven) == 1
    insert(db, "s", "s.N")
    make_poller("s", db, {"s.N": lambda job: "ok"}).claim()
    insert(db, "p", "p.N")

    written = {s for (s,) in db.query("SELECT status FROM jobs UNION SELECT last_error FROM jobs")} - {None}
    kinds = {}
    for status in written:
        kinds.setdefault(st.kind(status), set()).add(status)
    assert set(kinds) == set(st.Kind), kinds
    # Every writer wrote: only the row left claimed on purpose is still started.
    assert db.query("SELECT queue FROM jobs WHERE status = 'started'") == [("s",)]
    assert st.INTERRUPTED in written
    assert len(written) >= 12, written
