"""What a worker process reports reaches Sentry, whichever part reports it:
the lease renewal's native thread as well as the greenlets on the hub, and
one part's report never stops another's. Real worker processes, a real
Sentry endpoint on loopback (tests/sentry_server.py)."""

import contextlib
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sentry_server import SentryServer
from tests_support import ROOT, wait_for

from lib.insert import insert
from lib.store.db import DB

REPORT_WORKER = ROOT / "tests" / "apps" / "report_worker.py"
LEASE = 3.0
# The main thread, the lease renewal's and the hub watch's, and room for
# the odd helper; a thread per report, or per hub, passes this within seconds.
MOST_THREADS = 6


@pytest.fixture
def sentry() -> Iterator[SentryServer]:
    server = SentryServer()
    yield server
    server.close()


@contextmanager
def renewals_refused(db: DB) -> Iterator[None]:
    """Every lease renewal fails, on the server: an UPDATE of jobs from the
    renewal thread's connection (application_name jobs-leases) raises."""
    db.exec(
        "CREATE OR REPLACE FUNCTION refuse_renewal() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        " IF current_setting('application_name') = 'jobs-leases' THEN"
        " RAISE EXCEPTION 'lease renewal refused by the test'; END IF; RETURN NEW; END $$"
    )
    db.exec("CREATE TRIGGER refuse_renewal BEFORE UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION refuse_renewal()")
    try:
        yield
    finally:
        db.exec("DROP TRIGGER IF EXISTS refuse_renewal ON jobs")


def threads(pid: int) -> int:
    """The process's OS threads now."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("Threads:")))


def start_worker(database_url: str, sentry: SentryServer, log_path: Path) -> subprocess.Popen:
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(REPORT_WORKER)],
            env={
                "PATH": "/usr/bin:/bin",
                "JOBS_HTTP_ADDR": "off",
                "DATABASE_URL": database_url,
                "JOBS_LEASE_SECONDS": str(LEASE),
                "SENTRY_DSN": sentry.dsn,
            },
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    wait_for(lambda: "running 1 queues" in log_path.read_text(), 30)
    return proc


def reported(sentry: SentryServer, text: str) -> bool:
    """Whether an event whose exception's message holds text has arrived."""
    return any(text in str(value) for value in exception_values(sentry))


def exception_values(sentry: SentryServer) -> list[str]:
    return [v.get("value") for e in list(sentry.events) for v in e.get("exception", {}).get("values", [])]


def finished(db: DB, job_id: int) -> bool:
    return db.query_row("SELECT status FROM jobs WHERE id = %s", (job_id,))[0] not in ("pending", "started")


def test_the_lease_threads_report_and_a_later_handlers_both_reach_sentry(db, database_url, sentry, tmp_path):
    log_path = tmp_path / "worker.log"
    seen_threads: list[int] = []
    with renewals_refused(db):
        proc = start_worker(database_url, sentry, log_path)
        try:

            def watched(done: Callable[[], bool]) -> Callable[[], bool]:
                # The thread count is read all along, not only at the end.
                return lambda: seen_threads.append(threads(proc.pid)) or done()

            # Its renewals fail while it runs this, until the fence stops it.
            held = insert(db, "report", "report.Sleep", {"seconds": 60})
            wait_for(watched(lambda: finished(db, held)), 30, every=0.2)
            # Then a part on the hub reports: the handler's fault.
            raised = insert(db, "report", "report.Raise")
            wait_for(watched(lambda: finished(db, raised)), 30, every=0.2)
            both = watched(
                lambda: reported(sentry, "lease renewal refused") and reported(sentry, "the handler's own fault")
            )
            with contextlib.suppress(AssertionError):  # said below, with the rest
                wait_for(both, 15, every=0.2)
            log = log_path.read_text()
            held_lines = log.count("hub has been held")
            what = f"events: {exception_values(sentry)}; threads: {seen_threads}; held-hub lines: {held_lines}"
            assert both(), what
            assert max(seen_threads) <= MOST_THREADS, what
            assert held_lines == 0, f"{what}; log:\n{log[-3000:]}"
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0, log_path.read_text()[-3000:]
        finally:
            proc.kill()
