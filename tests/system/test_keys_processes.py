"""Order per key across worker processes: 3 real workers
(tests/apps/keys_worker.py) on one queue of concurrency 5, 5 keys x 40 jobs
of random durations, and one of them killed with SIGKILL in the middle of a
job. From the runs each handler wrote down: no two jobs of one key ever ran
at once, each key's jobs started in the order they were enqueued (a job cut
off starts again, in its place, once its lease lapses), and at least 4 keys
ran at once at some moment. The scenario runs once for the module."""

import itertools
import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests_support import ROOT, wait_for

from lib.insert import Job, insert_many
from lib.store.db import DB

APP = ROOT / "tests" / "apps" / "keys_worker.py"
KEYS = [f"repo:octo/r{n}" for n in range(5)]
PER_KEY = 40
LONG = 3.0  # the job the kill cuts off runs this long
LEASE = 3.0
# A handler that returned this close before the kill may have had its outcome
# still on its way to the database; such a job runs again, as any would.
UNWRITTEN = 1.0


@dataclass
class Run:
    pid: int
    job: int
    key: str
    start: float
    stop: float | None  # None: cut off


@dataclass
class Scenario:
    runs: list[Run]
    order: dict[str, list[int]]  # each key's job ids in enqueue order
    killed_job: int
    killed_pid: int
    killed_at: float
    statuses: set[str]


def read_runs(path: Path) -> list[Run]:
    open_runs: dict[tuple[int, int], Run] = {}
    runs: list[Run] = []
    for line in path.read_text().splitlines():
        event, pid, job, key, at = line.split()
        if event == "start":
            run = Run(int(pid), int(job), key, float(at), None)
            open_runs[run.pid, run.job] = run
            runs.append(run)
        else:
            open_runs.pop((int(pid), int(job))).stop = float(at)
    return runs


@pytest.fixture(scope="module")
def scenario(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    runs_file = tmp_path_factory.mktemp("keys") / "runs"
    runs_file.touch()
    db = DB.connect(database_url, size=2, application_name="keys-test")
    procs: list[subprocess.Popen] = []
    try:
        db.exec("TRUNCATE jobs, job_queues, workers RESTART IDENTITY")
        rng = random.Random(7)
        jobs = [
            Job("keyed", "keyed.Sleep", {"key": key, "seconds": round(rng.uniform(0.01, 0.12), 3)}, key=key)
            for _ in range(PER_KEY)
            for key in KEYS
        ]
        # One job in the middle of key r2's turn runs long: the kill cuts it off.
        long_index = 20 * len(KEYS) + 2
        jobs[long_index] = Job("keyed", "keyed.Sleep", {"key": KEYS[2], "seconds": LONG}, key=KEYS[2])
        with db.connection() as conn:
            ids = insert_many(conn, jobs)
        order: dict[str, list[int]] = defaultdict(list)
        for job, job_id in zip(jobs, ids, strict=True):
            order[job.key].append(job_id)
        env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "JOBS_HTTP_ADDR": "off",
            "LOG_LEVEL": "WARNING",
            "JOBS_LEASE_SECONDS": str(LEASE),
            "RUNS_FILE": str(runs_file),
        }
        procs = [
            subprocess.Popen([sys.executable, str(APP)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            for _ in range(3)
        ]
        long_id = ids[long_index]

        def long_started() -> Run | None:
            return next((r for r in read_runs(runs_file) if r.job == long_id), None)

        victim = wait_for(long_started, 60, every=0.02, what="the long job started")
        killed = next(p for p in procs if p.pid == victim.pid)
        killed.kill()
        killed.wait(10)
        killed_at = time.time()
        done = "SELECT count(*) FROM jobs WHERE status NOT IN ('pending', 'started')"
        wait_for(lambda: db.query_row(done)[0] == len(jobs), 90, every=0.2, what="every job ended")
        statuses = {row[0] for row in db.query("SELECT DISTINCT status FROM jobs")}
        return Scenario(read_runs(runs_file), dict(order), long_id, victim.pid, killed_at, statuses)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(30)
        db.close()


def test_every_job_ended_ok_and_those_cut_off_ran_again(scenario):
    """The kill cut off the long job and whatever else its process ran then;
    each ran once more. A job whose handler returned in that process just
    before the kill, with its outcome not yet written, ran once more too.
    Every other job ran once."""
    assert scenario.statuses == {"ok"}
    cut_off = {r.job for r in scenario.runs if r.stop is None}
    assert scenario.killed_job in cut_off
    assert {r.pid for r in scenario.runs if r.stop is None} == {scenario.killed_pid}
    runs_of = defaultdict(int)
    for run in scenario.runs:
        runs_of[run.job] += 1
    assert set(runs_of.values()) == {1, 2}
    twice = {job for job, n in runs_of.items() if n == 2}
    assert cut_off <= twice
    for job in twice - cut_off:
        first = min((r for r in scenario.runs if r.job == job), key=lambda r: r.start)
        assert first.pid == scenario.killed_pid, first
        assert scenario.killed_at - first.stop < UNWRITTEN, (first, scenario.killed_at)


def test_no_two_jobs_of_one_key_overlap(scenario):
    by_key: dict[str, list[Run]] = defaultdict(list)
    for run in scenario.runs:
        by_key[run.key].append(run)
    for key, runs in by_key.items():
        runs.sort(key=lambda r: r.start)
        for before, after in itertools.pairwise(runs):
            # A run cut off by the kill ended when its process died.
            ended = before.stop if before.stop is not None else scenario.killed_at
            assert ended <= after.start, (key, before, after)


def test_each_key_starts_its_jobs_in_the_order_enqueued(scenario):
    for key, ids in scenario.order.items():
        started = [r.job for r in sorted(scenario.runs, key=lambda r: r.start) if r.key == key]
        # The job cut off starts again before any later job of its key.
        again = [job for i, job in enumerate(started) if i == 0 or job != started[i - 1]]
        assert again == ids, key


def test_at_least_four_keys_ran_at_once(scenario):
    events = sorted(
        [(r.start, 1, r.key) for r in scenario.runs]
        + [(r.stop if r.stop is not None else scenario.killed_at, -1, r.key) for r in scenario.runs]
    )
    running: dict[str, int] = defaultdict(int)
    most = 0
    for _, step, key in events:
        running[key] += step
        most = max(most, sum(1 for n in running.values() if n > 0))
    assert most >= 4
