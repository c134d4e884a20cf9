"""A queue's concurrency changed at run time holds across worker processes:
two real workers (tests/apps/scale_worker.py) of one queue whose definition
allows 4 jobs at once, each of 50 ms, scaled by the command line (`scale sc
N`) from 1 to 4 and back to 1 while they run. The jobs running at every
instant never outnumber the setting in force: the database's slot count.
Running is read from the handlers' own start and end, each inside its job's
claim and outcome: a row's started_at is its claim transaction's start,
which can come before the outcome that freed the slot committed (another
process's claim that waited for the CPU before it took the queue's turn),
so rows' times could show two at once that never ran at once."""

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tests_support import ROOT, wait_for

from lib.insert import Job, insert_many
from lib.store.db import DB

APP = ROOT / "tests" / "apps" / "scale_worker.py"
PHASE = 1.5  # seconds each setting is watched
SETTLE = timedelta(seconds=0.3)  # for the jobs started before a lowering to end (50 ms each)


def most_started(rows: list[tuple[datetime, datetime]], since: datetime, until: datetime) -> int:
    """The most jobs running at once at any instant of [since, until): each
    from its start up to its end; an end at the same instant as another's
    start comes first."""
    events = []
    for started, finished in rows:
        if started < until and finished > since:
            events += [(max(started, since), 1), (min(finished, until), -1)]
    most = running = 0
    for _, change in sorted(events):
        running += change
        most = max(most, running)
    return most


def runs(path: Path) -> list[tuple[datetime, datetime]]:
    """Each handler's start and end, as scale_worker.py wrote them."""
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        began, ended = (datetime.fromtimestamp(float(t), UTC) for t in line.split())
        found.append((began, ended))
    return found


def test_scaling_from_1_to_4_and_back_holds_across_two_processes(database_url, tmp_path):
    db = DB.connect(database_url, size=2, application_name="scale-test")
    runs_file = tmp_path / "runs"
    env = {**os.environ, "DATABASE_URL": database_url, "JOBS_HTTP_ADDR": "off", "LOG_LEVEL": "WARNING"}
    env["RUNS_FILE"] = str(runs_file)

    def now() -> datetime:
        return db.query_row("SELECT clock_timestamp()")[0]

    def scale(to: int) -> tuple[datetime, datetime]:
        """The command line's scale; the server's clock before it began and
        after it returned: its commit is somewhere between."""
        began = now()
        done = subprocess.run(
            [sys.executable, str(APP), "scale", "sc", str(to)], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        return began, now()

    def started() -> int:
        return db.query_row("SELECT count(*) FROM jobs WHERE queue = 'sc' AND status = 'started'")[0]

    procs: list[subprocess.Popen] = []
    try:
        db.exec("TRUNCATE jobs, job_queues, workers RESTART IDENTITY CASCADE")
        with db.connection() as conn:
            insert_many(conn, [Job("sc", "sc.Work") for _ in range(3000)])
        one = scale(1)
        procs = [
            subprocess.Popen([sys.executable, str(APP)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            for _ in range(2)
        ]
        wait_for(lambda: started() >= 1, 30, what="a job started")
        time.sleep(PHASE)
        four = scale(4)
        asked = time.monotonic()
        wait_for(lambda: started() == 4, 10, every=0.005, what="four jobs at once")
        reached = time.monotonic() - asked
        time.sleep(PHASE)
        back = scale(1)
        time.sleep(PHASE)
        end = now()
        # Both processes ran the queue all along, each asking for every slot;
        # which of them holds a slot is a race (a busy slot's outcome and its
        # next claim are one step, so its process tends to keep it).
        pids = {p.pid for p in procs}
        live = "SELECT pid FROM workers WHERE 'sc' = ANY(queues) AND last_seen > now() - interval '10 seconds'"
        assert {row[0] for row in db.query(live)} == pids
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            assert proc.wait(30) == 0, proc.stderr.read().decode()
    rows = runs(runs_file)
    db.close()
    assert most_started(rows, one[1], four[0]) == 1
    assert most_started(rows, four[1], back[0]) == 4
    assert most_started(rows, back[1] + SETTLE, end) == 1
    # Every process heeds the raise at once (NOTIFY), not at its next poll;
    # generous here, where the machine is shared.
    assert reached < 2.0, reached
