"""A rolling upgrade, with real worker processes of two releases on one
queue: the older (A) handles up.Old, the newer (B) up.Old and up.New. A
leaves every up.New job to B, uncounted and in its place in the queue; a
name neither handles (up.Typo) still ends at once as an unknown job."""

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg2
import pytest
from tests_support import ROOT, make_poller, wait_for

from lib.background import worker_registry
from lib.insert import insert
from lib.job import status
from lib.run.poller import Poller

RELEASE_WORKER = ROOT / "tests" / "apps" / "release_worker.py"
LEFT_LINE = "job=up.New is left to the workers that handle it"
# Each batch is enqueued in one transaction once the queue is idle: its
# NOTIFY wakes both workers, so either may claim its head.
BATCH = ("up.New", "up.Old", "up.New")
BATCHES = 10
# Which worker claims a batch's head is a race: batches go on until A has
# claimed an up.New (and left it to B) at least once, up to this many.
MAX_BATCHES = 60


@contextmanager
def release_workers(tmp_path: Path, url: str, concurrency: int) -> Iterator[dict[str, tuple[subprocess.Popen, Path]]]:
    """Workers of releases A and B started together, once both listen for wakeups."""
    procs: dict[str, tuple[subprocess.Popen, Path]] = {}
    try:
        for release in ("A", "B"):
            log_path = tmp_path / f"worker{release}.log"
            with open(log_path, "w") as log:
                proc = subprocess.Popen(
                    [sys.executable, str(RELEASE_WORKER)],
                    env={
                        "PATH": "/usr/bin:/bin",
                        "JOBS_HTTP_ADDR": "off",
                        "DATABASE_URL": url,
                        "RELEASE": release,
                        "CONCURRENCY": str(concurrency),
                        "RUNS_FILE": str(tmp_path / "runs"),
                    },
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            procs[release] = (proc, log_path)
        for _, log_path in procs.values():
            wait_for(lambda path=log_path: "listening for wakeups" in path.read_text(), 30)
        yield procs
        for proc, log_path in procs.values():
            assert proc.poll() is None, log_path.read_text()[-3000:]
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0, log_path.read_text()[-3000:]
            assert " died: " not in log_path.read_text(), log_path.read_text()[-3000:]
    finally:
        for proc, _ in procs.values():
            proc.kill()


def runs(tmp_path: Path) -> list[tuple[int, int]]:
    """(pid, job id) of each handler run, in the order they started."""
    path = tmp_path / "runs"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(int(pid), int(job_id)) for _, pid, job_id, _name in (line.split() for line in lines)]


def idle(db) -> bool:
    return db.query_row("SELECT count(*) FROM jobs WHERE status IN ('pending', 'started')")[0] == 0


def enqueue_batch(url: str, names: tuple[str, ...]) -> list[int]:
    conn = psycopg2.connect(url)
    try:
        with conn, conn.cursor() as cur:
            return [insert(cur, "up", name, {"n": i}) for i, name in enumerate(names)]
    finally:
        conn.close()


def ended(db, job_ids: list[int]) -> list[tuple[str, int]]:
    return db.query("SELECT status, attempts FROM jobs WHERE id = ANY(%s) ORDER BY id", (job_ids,))


@pytest.mark.parametrize("concurrency", [1, 3])
def test_an_older_worker_leaves_the_newer_releases_jobs_to_it(db, database_url, tmp_path, concurrency):
    names: dict[int, str] = {}
    with release_workers(tmp_path, database_url, concurrency) as procs:
        for n in range(MAX_BATCHES):
            batch = (*BATCH, "up.Typo") if n == BATCHES // 2 else BATCH
            names.update(zip(enqueue_batch(database_url, batch), batch, strict=True))
            wait_for(lambda: idle(db), 30)
            if n + 1 >= BATCHES and LEFT_LINE in procs["A"][1].read_text():
                break
        batches = n + 1
        # Once the queue is idle, a name neither release handles ends at once.
        [late_typo] = enqueue_batch(database_url, ("up.Typo",))
        enqueued = time.monotonic()
        wait_for(lambda: idle(db), 30)
        took = time.monotonic() - enqueued
        pid = {release: proc.pid for release, (proc, _) in procs.items()}
        left_lines = procs["A"][1].read_text().count(LEFT_LINE)

    new = [i for i, name in names.items() if name == "up.New"]
    old = [i for i, name in names.items() if name == "up.Old"]
    typos = [i for i, name in names.items() if name == "up.Typo"] + [late_typo]
    assert len(new) == 2 * batches
    assert ended(db, new) == [("ok", 1)] * len(new)
    assert ended(db, old) == [("ok", 1)] * len(old)
    for said, attempts in ended(db, typos):
        assert said.startswith("err: UnknownJob") and attempts == 1, said
    assert took < 5
    started = runs(tmp_path)
    # Every up.New run once, by B; every up.Old once, by either.
    assert sorted(job_id for p, job_id in started if job_id in new and p == pid["B"]) == new
    assert sorted(job_id for _, job_id in started) == sorted(new + old)
    if concurrency == 1:
        # FIFO: nothing behind a job given back ran before it.
        assert [job_id for _, job_id in started] == sorted(new + old)
    # A did claim up.New jobs and gave them back, and said so once (within
    # MAX_BATCHES races: losing them all would be a fault, not chance).
    assert left_lines == 1


def older_poller(db) -> Poller:
    return make_poller("up", db, {"up.Old": lambda job: status.ok()})


def test_a_job_a_live_worker_handles_is_given_back_uncounted_and_ended_once_none_does(db):
    worker_registry.register(db, "newer", ["up"], 30.0, [("up", ["up.Old", "up.New"])])
    job_id = insert(db, "up", "up.New", {})
    poller = older_poller(db)
    assert poller.work_once() == "pending"
    assert db.query_row("SELECT status, attempts, worker_id, slot FROM jobs WHERE id = %s", (job_id,)) == (
        "pending",
        0,
        None,
        None,
    )
    # Unseen for more than three of its leases, it is not alive: no one runs the name.
    db.exec("UPDATE workers SET last_seen = now() - interval '91 seconds'")
    assert poller.work_once().startswith("err: UnknownJob")
    assert db.query_row("SELECT attempts FROM jobs WHERE id = %s", (job_id,)) == (1,)


def test_a_job_whose_handlers_cannot_be_learnt_ends_as_an_unknown_job(db):
    worker_registry.register(db, "newer", ["up"], 30.0, [("up", ["up.New"])])
    insert(db, "up", "up.New", {})
    db.exec("ALTER TABLE workers RENAME COLUMN handles TO handles_away")
    try:
        assert older_poller(db).work_once().startswith("err: UnknownJob")
    finally:
        db.exec("ALTER TABLE workers RENAME COLUMN handles_away TO handles")
