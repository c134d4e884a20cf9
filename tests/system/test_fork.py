"""A handler that forks, in a real worker process: the fork is refused with a
readable error, so no clone of the worker (its pollers, lease keeper and
database connections) runs jobs of its own; subprocess and multiprocessing's
"spawn" context still start processes."""

import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests_support import ROOT, wait_for

from lib.insert import insert

FORK_WORKER = ROOT / "tests" / "apps" / "fork_worker.py"
# The ways a handler can fork (tests/apps/fork_worker.py's FORKS).
FORKS = ["os.fork", "os.forkpty", "pty.fork", "posix.fork", "gevent.fork", "multiprocessing.fork"]
REFUSED = "err: ForkRefused: "


@contextmanager
def fork_worker(database_url: str, tmp_path: Path) -> Iterator[subprocess.Popen]:
    """A running fork_worker; on leaving, it is still running, exits 0 on
    SIGTERM, and no part of it died on the way."""
    (tmp_path / "markers").mkdir()
    log_path = tmp_path / "worker.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(FORK_WORKER)],
            env={
                "PATH": "/usr/bin:/bin",
                "JOBS_HTTP_ADDR": "off",
                "DATABASE_URL": database_url,
                "RUNS_FILE": str(tmp_path / "runs"),
                "MARKERS": str(tmp_path / "markers"),
            },
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: "running 2 queues" in log_path.read_text(), 30)
        yield proc
        assert proc.poll() is None, log_path.read_text()[-3000:]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log_path.read_text()[-3000:]
        assert " died: " not in log_path.read_text(), log_path.read_text()[-3000:]
    finally:
        proc.kill()
        proc.wait()


def finished(db, ids: list[int], timeout: float = 60) -> dict[int, str]:
    """Each job's status, once none of them is pending or started."""
    pending = "SELECT count(*) FROM jobs WHERE id = ANY(%s) AND status IN ('pending', 'started')"
    wait_for(lambda: db.query_row(pending, (ids,))[0] == 0, timeout)
    return dict(db.query("SELECT id, status FROM jobs WHERE id = ANY(%s)", (ids,)))


def runs(tmp_path: Path) -> list[tuple[int, int]]:
    """(pid, job id) of each run of noop.Run."""
    path = tmp_path / "runs"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(int(pid), int(job_id)) for pid, job_id in (line.split() for line in lines)]


def test_a_handler_that_forks_is_refused_and_the_worker_alone_runs_the_other_queue(db, database_url, tmp_path):
    with fork_worker(database_url, tmp_path) as proc:
        fork_id = insert(db, "forks", "fork.Fork", {"how": "os.fork"})
        fork_status = finished(db, [fork_id])[fork_id]
        # One at a time, each woken by its own NOTIFY, while a child, had the
        # fork been made, would still be a clone of the worker.
        noop_ids = [insert(db, "noop", "noop.Run", {}) for _ in range(200)]
        noop_statuses = finished(db, noop_ids)
    ran = runs(tmp_path)
    assert Counter(pid for pid, _ in ran) == {proc.pid: 200}
    assert sorted(job_id for _, job_id in ran) == sorted(noop_ids)
    assert set(noop_statuses.values()) == {"ok"}
    assert list((tmp_path / "markers").iterdir()) == []
    assert fork_status.startswith(REFUSED + "os.fork() is refused in a worker process"), fork_status
    assert "subprocess" in fork_status and "'spawn'" in fork_status, fork_status


def test_each_way_to_fork_is_refused_and_subprocess_and_spawn_still_start_processes(db, database_url, tmp_path):
    with fork_worker(database_url, tmp_path) as proc:
        by_how = {how: insert(db, "forks", "fork.Fork", {"how": how}) for how in FORKS}
        sub_id = insert(db, "forks", "fork.Subprocess", {})
        spawn_id = insert(db, "forks", "fork.Spawn", {})
        statuses = finished(db, [*by_how.values(), sub_id, spawn_id])
    for how, job_id in by_how.items():
        assert statuses[job_id].startswith(REFUSED), (how, statuses[job_id])
        assert "is refused in a worker process" in statuses[job_id], (how, statuses[job_id])
        assert "subprocess" in statuses[job_id], (how, statuses[job_id])
    assert list((tmp_path / "markers").iterdir()) == []
    for job_id in (sub_id, spawn_id):
        assert statuses[job_id].startswith("ok: child "), statuses[job_id]
        assert int(statuses[job_id].removeprefix("ok: child ")) != proc.pid
