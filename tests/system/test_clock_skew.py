"""Two worker processes on one every-minute schedule, one on a host whose
clock runs ten minutes ahead (faketime): at a minute of the database's clock
the shared entry fires once, and each worker's own entry fires at the
database's minute, never ten minutes early. (tests/db/test_clock.py holds
the once-a-minute over consecutive minutes.)"""

import glob
import os
import re
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from programs import require
from tests_support import ROOT, wait_for

from lib.background.clock import Scheduled, every
from lib.store.db import DB

require("/usr/bin/faketime", "faketime")  # the package, whose library is preloaded below
CLOCK_WORKER = ROOT / "tests" / "apps" / "clock_worker.py"
AHEAD = timedelta(minutes=10)
MINUTE = timedelta(minutes=1)
# libfaketime preloaded into the worker itself, not the faketime command,
# which runs its program as a child and leaves it running when it is killed.
# Only the wall clock is off, as on a host whose time is wrong: the monotonic
# clock a process measures intervals by is not a time of day.
LIBFAKETIME = next(iter(sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1"))), None)
SKEWED = {"LD_PRELOAD": LIBFAKETIME or "", "FAKETIME": "+10m", "DONT_FAKE_MONOTONIC": "1"}
STARTED = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO jobs\.worker worker \S+ running 1 queues: ticks")


def start(database_url: str, name: str, log: Path, skew: dict[str, str]) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen(
            [sys.executable, str(CLOCK_WORKER)],
            cwd=ROOT,
            env={
                **os.environ,
                **skew,
                "DATABASE_URL": database_url,
                "CLOCK_WORKER": name,
                "LOG_LEVEL": "INFO",
                "LOG_FORMAT": "text",
                "TZ": "UTC",
            },
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def started_at(log: Path) -> datetime | None:
    """The time, by its process's clock, that the worker logged it was running
    (found in the line, which another writer to the stream may have begun:
    gevent's report of a thread's failure, say)."""
    for line in log.read_text().splitlines():
        if found := STARTED.search(line):
            return datetime.strptime(found[1], "%Y-%m-%d %H:%M:%S,%f")
    return None


def fired(db: DB, by: str) -> list[datetime]:
    """The minutes clock_ticks records for the entry {"by": by}."""
    entry = Scheduled("ticks", "ticks.Run", every(1), args={"by": by}).key
    return [m for (m,) in db.query("SELECT minute FROM clock_ticks WHERE entry = %s ORDER BY minute", (entry,))]


def db_now(db: DB) -> datetime:
    return db.query_row("SELECT clock_timestamp()")[0]


@pytest.fixture
def ticks_db(db: DB) -> DB:
    db.exec("TRUNCATE clock_ticks")
    return db


def test_a_worker_whose_host_clock_runs_ahead_fires_at_the_databases_minutes(ticks_db, database_url, tmp_path):
    db = ticks_db
    logs = {name: tmp_path / f"{name}.log" for name in ("right", "ahead")}
    assert LIBFAKETIME, "the faketime package is installed, but not its library"
    procs = [start(database_url, "right", logs["right"], {}), start(database_url, "ahead", logs["ahead"], SKEWED)]
    try:
        up = {
            name: wait_for(lambda log=log: started_at(log), 60, 0.2, f"{name} to start") for name, log in logs.items()
        }
        # The skew is real: the worker ahead wrote the time of day ten minutes on.
        assert abs((up["ahead"] - up["right"]) - AHEAD) < timedelta(seconds=30), up
        # The next minute boundary by the database's clock, both workers up:
        # ten minutes early, the worker ahead would have fired it already.
        minutes = [db_now(db).replace(second=0, microsecond=0) + MINUTE]
        # Past it, and every clock's tick of it over.
        wait_for(lambda: db_now(db) > minutes[-1] + timedelta(seconds=5), 90, 0.5, f"the database's {minutes[-1]}")
        assert all(p.poll() is None for p in procs), [log.read_text()[-2000:] for log in logs.values()]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
        assert all(p.returncode is not None for p in procs)
    # Each worker's lease renewal ran to its stop: none ended on the skewed clock.
    for name, log in logs.items():
        assert "_Renewal" not in log.read_text(), (name, log.read_text()[-3000:])
    now = db_now(db)
    for by in ("all", "right", "ahead"):
        got = fired(db, by)
        assert all(minute <= now for minute in got), f"entry {by} fired ahead of the database: {got}, at {now}"
        assert [m for m in got if minutes[0] <= m <= minutes[-1]] == minutes, (by, got)
    # Once per minute: a job each, enqueued at its minute by the database's clock.
    jobs = db.query(
        "SELECT created_at FROM jobs WHERE name = 'ticks.Run' AND args = '{\"by\": \"all\"}'"
        " AND created_at >= %s AND created_at < %s ORDER BY id",
        (minutes[0], minutes[-1] + MINUTE),
    )
    assert [created.replace(second=0, microsecond=0) for (created,) in jobs] == minutes, jobs
