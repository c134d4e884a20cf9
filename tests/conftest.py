from gevent import monkey

monkey.patch_all()  # before anything imports socket, ssl or threading users

import os  # noqa: E402
from collections.abc import Callable, Iterator, Mapping  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import sentry_sdk  # noqa: E402
from programs import MISSING  # noqa: E402
from sentry_sdk.transport import Transport  # noqa: E402
from tests_support import scratch_database, superuser_url  # noqa: E402

from lib.run.runtime import Runtime  # noqa: E402
from lib.setup import embedded, error_reports  # noqa: E402
from lib.setup.settings import Settings  # noqa: E402
from lib.store.db import DB  # noqa: E402
from lib.store.migrate import migrate  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

# Every worker process a test starts would serve HTTP on the same default port
# (and so would other suites on this machine): off unless a test asks for it.
os.environ["JOBS_HTTP_ADDR"] = "off"
# Tests rewrite source files that a process they start has already imported,
# often within the same second and at the same size, which is all a cached
# .pyc is checked against: the next process would run the old code. The
# processes the tests start write no bytecode, so each reads the source.
os.environ["PYTHONDONTWRITEBYTECODE"] = "1"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    """Under CI=true a test module skipped for a missing Debian package
    (tests/programs.py) fails: CI must run the browser and pooler tests, not
    pass without them."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") != "true" or not report.skipped or not isinstance(report.longrepr, tuple):
        return
    reason = str(report.longrepr[2]).removeprefix("Skipped: ")
    if reason.startswith(MISSING):
        report.outcome = "failed"
        report.longrepr = f"CI=true: {reason}"


@pytest.fixture(scope="session")
def server_url() -> str:
    """The server the suite runs on: DATABASE_URL, else the embedded one."""
    return embedded.database_url(Settings.from_environ(), ROOT / ".pgdata" / "test")


@pytest.fixture(scope="session")
def database_url(server_url: str) -> Iterator[str]:
    """A fresh, migrated database for this run, so runs never meet."""
    with scratch_database(server_url, "jobs_test") as url:
        db = DB.connect(url, size=2)
        migrate(db)
        db.close()
        yield url


@pytest.fixture
def db(database_url: str) -> Iterator[DB]:
    """A pool on the run's database with empty job tables."""
    pool = DB.connect(database_url, size=8, application_name="jobs-test")
    pool.exec(
        "TRUNCATE jobs, cache_entries, job_queues, job_rates, job_dedupe_names, clock_ticks, workers, job_minutes,"
        " job_steps, job_waiters, job_waits RESTART IDENTITY"
    )
    yield pool
    pool.close()


@pytest.fixture
def admin_db(db: DB, database_url: str, server_url: str) -> Iterator[DB]:
    """A pool on the run's database as the server's superuser, for what only
    an administrator may do (turn triggers off for a bulk load, count function
    calls, load auto_explain); the worker and the tests' own statements run as
    the database's owner (db), as on a managed Postgres."""
    pool = DB.connect(superuser_url(database_url, server_url), size=2, application_name="jobs-test-admin")
    yield pool
    pool.close()


@pytest.fixture
def runtime(db: DB) -> Runtime:
    """One runtime on db (Runtime.alone): the pollers given it share a lease
    keeper and a group commit, as one worker's pollers do."""
    return Runtime.alone(db)


class CapturingTransport(Transport):
    """A real sentry-sdk transport that keeps envelopes instead of sending them."""

    def __init__(self, options: dict | None = None) -> None:
        super().__init__(options)
        self.events: list[dict] = []

    def capture_envelope(self, envelope) -> None:  # type: ignore[no-untyped-def]
        for item in envelope.items:
            if item.type == "event":
                self.events.append(item.payload.json)


@pytest.fixture
def sentry_events() -> Iterator[list[dict]]:
    transport = CapturingTransport()
    error_reports.init("http://public@127.0.0.1:9/1", transport=transport)
    yield transport.events
    sentry_sdk.get_client().close()
    sentry_sdk.init()  # back to no client: later tests send nothing


@pytest.fixture
def settings_of(monkeypatch: pytest.MonkeyPatch) -> Callable[[Mapping[str, str]], Settings]:
    """settings_of(env): the settings worker.main would read from env, their
    secrets masked by lib.setup.error_reports as worker.main has them masked, until the test ends."""

    def read(env: Mapping[str, str]) -> Settings:
        settings = Settings.from_env(env)
        monkeypatch.setattr(error_reports, "_secrets", [])  # put back as it was after the test
        error_reports.configure(settings)
        return settings

    return read


@pytest.fixture
def empty_database(server_url: str) -> Iterator[str]:
    """The URL of a new database with no migrations applied."""
    with scratch_database(server_url, "jobs_empty") as url:
        yield url
