"""The sides of bench/compare.py: how the benchmark drives each library (its
processes, its settings for each workload, the SQL that reads its own
tables), this worker's by default and each peer's overriding it.

A side's worker and enqueue processes are bench/apps/compare_<name>.py; the
peers run from their own virtualenv (--peer-python).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

from bench.harness import ROOT

APPS = ROOT / "bench" / "apps"
SIDES = ("ours", "oban", "chancy", "pgqueuer", "procrastinate", "dbos")
PEERS = SIDES[1:]
# Settings that would change what our worker does; the comparison runs its defaults.
UNSET = ("JOBS_LEASE_SECONDS", "SENTRY_DSN", "JOBS_ADMIN_TOKEN")


# ---------------------------------------------------------------- the sides


@dataclass(frozen=True)
class Setting:
    """One way to run a side's worker: as the output names it, and the
    options its worker app takes for it."""

    label: str
    args: tuple[str, ...] = ()
    # The held-horizon workload: a transaction another session keeps open over the run.
    hold: bool = False


def concurrency(n: int, label: str = "c={n}", *more: str) -> Setting:
    return Setting(label.format(n=n), ("--concurrency", str(n), *more))


def one_each(label: str, option: str, values: tuple[int, ...]) -> tuple[Setting, ...]:
    """Concurrency 1 with each of an option's values: one_each("pool {v}", "--pool", (41, 10))."""
    return tuple(concurrency(1, label.format(v=v), option, str(v)) for v in values)


# Each side's settings for workloads 1 (one queue, one at a time), 2 (one
# queue, as fast as it goes: the sweep every run runs) and 3 (40 queues, one
# at a time each). Concurrency 1 is what workloads 1 and 3 are; their other
# knobs were chosen by a recorded sweep (RECORDED), the first is the one a
# run uses unless --sweep runs them all.
@dataclass(frozen=True)
class Side:
    """How the benchmark drives one library: its processes, its settings,
    and the SQL that reads its own tables. Ours by default; the peers override."""

    name: str = "ours"
    migrated: bool = True  # the scratch database gets our migrations
    # The interpreter of the side's processes: ours runs in the project's
    # virtualenv; the peers in theirs (--peer-python).
    python: str = sys.executable
    app: str = "compare_ours_worker.py"
    enqueue_app: str = "compare_ours_enqueue.py"
    command: tuple[str, ...] = ()  # the worker app's subcommand
    # The first handler start and the last outcome as the database records them, and the jobs done.
    span_sql: str = (
        "SELECT extract(epoch FROM min(started_at)), extract(epoch FROM max(finished_at)),"
        " count(*) FILTER (WHERE status = 'ok') FROM jobs"
    )
    settings: str = (
        "worker.main (a real worker process), one Poller per queue at concurrency C (1 for 40 queues),"
        " every other option at its default (LISTEN/NOTIFY wakes, 120 s fallback poll);"
        " JOBS_HTTP_ADDR=off, LOG_LEVEL=WARNING; enqueue: lib.insert (psycopg2)"
    )
    serial: tuple[Setting, ...] = (concurrency(1),)
    fastest: tuple[Setting, ...] = ()  # ours: --concurrencies
    # Whether its API enqueues many jobs in one transaction; when not, why, as the table says it.
    batch_enqueue: str | None = None
    many: tuple[Setting, ...] = (concurrency(1, "c=1 each"),)

    def install(self, url: str) -> None:
        """Our schema comes with the scratch database (its migrations)."""

    def worker_command(self, url: str, queues: list[str], setting: Setting) -> list[str]:
        return [
            self.python,
            str(APPS / self.app),
            *self.command,
            "--url",
            url,
            "--queues",
            _queues(queues),
            *setting.args,
        ]

    def worker_env(self, url: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in UNSET}
        # No HTTP endpoints (several workers may run on this machine), and no
        # per-job INFO line, which would cost more than a no-op job.
        env.update(DATABASE_URL=url, JOBS_HTTP_ADDR="off", LOG_LEVEL="WARNING")
        return env

    def enqueue_command(self, mode: str, url: str, queues: list[str], jobs: int, batch: int = 1) -> list[str]:
        command = [
            self.python,
            str(APPS / (self.enqueue_app or self.app)),
            mode,
            "--url",
            url,
            "--queues",
            _queues(queues),
        ]
        return [*command, "--jobs", str(jobs), "--batch", str(batch)]


def _queues(names: list[str]) -> str:
    return ",".join(names)


@dataclass(frozen=True)
class Peer(Side):
    """A peer's one app (bench/apps/compare_<name>.py): install, work, enqueue."""

    migrated: bool = False
    command: tuple[str, ...] = ("work",)
    enqueue_app: str = ""  # the app itself

    def install(self, url: str) -> None:
        subprocess.run([self.python, str(APPS / self.app), "install", "--url", url], check=True)


@dataclass(frozen=True)
class Oban(Peer):
    name: str = "oban"
    app: str = "compare_oban.py"
    span_sql: str = (
        "SELECT extract(epoch FROM min(attempted_at)), extract(epoch FROM max(completed_at)),"
        " count(*) FILTER (WHERE state = 'completed') FROM oban_jobs"
    )
    settings: str = (
        "Oban as `oban start` runs it (uvloop, psycopg pool, default 10), each queue at limit C;"
        " insert NOTIFY wakes a queue, a job's end wakes it to ack and fetch (5 ms debounce), stager's 1 s"
        " poll the fallback; leadership, pruner, lifeline at defaults, metrics off (default); logging WARNING;"
        " enqueue: Oban.enqueue / enqueue_many"
    )
    fastest: tuple[Setting, ...] = tuple(concurrency(n, "limit {n}") for n in (10, 50, 100))
    many: tuple[Setting, ...] = one_each("limit 1 each, pool {v}", "--pool", (10, 41))
    serial: tuple[Setting, ...] = (concurrency(1, "limit 1"),)


@dataclass(frozen=True)
class Chancy(Peer):
    name: str = "chancy"
    app: str = "compare_chancy.py"
    # completed_at is the job's end in the worker; bench_written_at the write of its outcome (a trigger of ours).
    span_sql: str = (
        "SELECT extract(epoch FROM min(started_at)), extract(epoch FROM max(bench_written_at)),"
        " count(*) FILTER (WHERE state = 'succeeded') FROM chancy_jobs"
    )
    settings: str = (
        "one Worker, default plugins, psycopg pool (default 10); each queue at concurrency C with the"
        " AsyncExecutor, eager_polling (a job's end fetches the next), LISTEN/NOTIFY on push, polling every"
        " 120 s (fallback); outcomes written in batches once a second (its default); logging WARNING;"
        " enqueue: push / push_many"
    )
    serial: tuple[Setting, ...] = (concurrency(1),)
    fastest: tuple[Setting, ...] = tuple(concurrency(n) for n in (16, 50, 100))
    many: tuple[Setting, ...] = one_each("c=1 each, pool {v}", "--pool", (41, 10))


@dataclass(frozen=True)
class PGQueuer(Peer):
    name: str = "pgqueuer"
    app: str = "compare_pgqueuer.py"
    # Finished rows leave its queue table; its log keeps each job's picked and successful moments.
    span_sql: str = (
        "SELECT extract(epoch FROM min(created) FILTER (WHERE status = 'picked')),"
        " extract(epoch FROM max(created) FILTER (WHERE status = 'successful')),"
        " count(*) FILTER (WHERE status = 'successful') FROM pgqueuer_log"
    )
    settings: str = (
        "QueueManager over one asyncpg connection; a queue is an entrypoint with concurrency_limit C"
        " (0: unlimited); batch_size B jobs per dequeue (its completion log flushes every B jobs or"
        " 0.1 s); dequeue_timeout 120 s (fallback only); log aggregation off; logging WARNING;"
        " enqueue: Queries.enqueue, lists for batches"
    )
    serial: tuple[Setting, ...] = one_each("c=1, batch {v}", "--batch-size", (1, 10))
    fastest: tuple[Setting, ...] = (
        concurrency(16, "c=16, batch 16", "--batch-size", "16"),
        concurrency(0, "unlimited, batch 50", "--batch-size", "50"),
        concurrency(0, "unlimited, batch 200", "--batch-size", "200"),
    )
    many: tuple[Setting, ...] = one_each("c=1 each, batch {v}", "--batch-size", (10, 40))


@dataclass(frozen=True)
class Procrastinate(Peer):
    name: str = "procrastinate"
    app: str = "compare_procrastinate.py"
    span_sql: str = (
        "SELECT extract(epoch FROM min(at) FILTER (WHERE type = 'started')),"
        " extract(epoch FROM max(at) FILTER (WHERE type = 'succeeded')),"
        " count(*) FILTER (WHERE type = 'succeeded') FROM procrastinate_events"
    )
    settings: str = (
        "async worker (PsycopgConnector, psycopg 3 pool of min 1, max jobs-at-once + 1), listen_notify=True,"
        " fetch/abort polling intervals 120 s (fallback only); one queue: one worker at concurrency C;"
        " 40 queues: one worker per queue at concurrency 1 in one process (no lock);"
        " jobs kept on success (default); logging WARNING; enqueue: defer_async / batch_defer_async"
    )
    fastest: tuple[Setting, ...] = tuple(concurrency(n) for n in (8, 16, 50))
    many: tuple[Setting, ...] = (concurrency(1, "c=1, a worker per queue", "--per-queue"),)


# DBOS's queues only poll (bench/apps/compare_dbos.py): the interval is a
# setting of every workload, the first of each list the one a run uses (the
# recorded sweep's best, RECORDED): one queue polls best every 10 ms, 40
# queues every 50 ms, where 40 threads' polls no longer fill the cores.
DBOS_POLLS = (0.01, 0.001, 0.05)
DBOS_MANY_POLLS = (0.05, 0.01, 0.001)


def polled(n: int, label: str, poll: float) -> Setting:
    return concurrency(n, f"{label}, poll {poll:g} s", "--polling-interval", str(poll))


@dataclass(frozen=True)
class Dbos(Peer):
    name: str = "dbos"
    app: str = "compare_dbos.py"
    # started_at_epoch_ms is the dequeue's claim; updated_at the outcome's write.
    span_sql: str = (
        "SELECT min(started_at_epoch_ms) / 1000.0, max(updated_at) / 1000.0,"
        " count(*) FILTER (WHERE status = 'SUCCESS') FROM dbos.workflow_status WHERE name = 'bench_noop'"
    )
    settings: str = (
        "DBOS.launch over the scratch database as its system database (schema dbos, its pool 20 to 50);"
        " a queue per benchmark queue (DBOSClient.register_queue) at worker_concurrency C, polled every"
        " polling_interval_sec P (no wake on enqueue: its queues only poll), a thread a running workflow;"
        " a job a no-op @DBOS.workflow; logging WARNING; enqueue: queue.enqueue, one workflow a call"
        " (no batch API)"
    )
    batch_enqueue: str | None = "no batch enqueue: queue.enqueue starts one workflow a call"
    serial: tuple[Setting, ...] = tuple(polled(1, "c=1", p) for p in DBOS_POLLS)
    fastest: tuple[Setting, ...] = tuple(polled(n, f"c={n}", DBOS_POLLS[0]) for n in (16, 50, 100))
    many: tuple[Setting, ...] = tuple(polled(1, "c=1 each", p) for p in DBOS_MANY_POLLS)


def make_side(name: str, peer_python: str) -> Side:
    if name == "ours":
        return Side()
    kinds = {"oban": Oban, "chancy": Chancy, "pgqueuer": PGQueuer, "procrastinate": Procrastinate, "dbos": Dbos}
    return kinds[name](python=peer_python)


# What each recorded sweep found (bench/compare.py --sweep --workloads 1,3),
# printed with the settings a run without --sweep uses: the first of each list.
SWEEP_COMMAND = ".venv/bin/python bench/compare.py --sweep --workloads 1,3"
RECORDED = (
    "2026-12-03 07:36 UTC, 5,000 jobs, 3 rounds (round 1's best in rounds 2 and 3), load 1.1 to 4.9; median jobs/s:",
    "pgqueuer 1: c=1, batch 1 250 (250, 325, 228); batch 10, its default, 10 (each job waits for its completion timer)",
    "pgqueuer 3: c=1 each, batch 10 6,214 (6,214, 6,620, 5,434); batch 40 6,063",
    "oban 3: limit 1 each, pool 10 (its default) 1,502 (1,321, 1,565, 1,502); pool 41 949",
    "chancy 3: c=1 each, pool 41 1,280 (789, 1,609, 1,280); pool 10 730",
    "dbos 1 and 3, 2026-12-07 00:57 UTC, 400 jobs, 1 round, beside another benchmark: polling_interval_sec"
    " 0.01 s 28, 0.001 s 16, 0.05 s 12 (one queue); 0.05 s 80, 0.01 s 77, 0.001 s 72 (40 queues)",
    "oban, chancy, procrastinate 1 and procrastinate 3: one setting (NOTIFY wakes, fallback polls), nothing to sweep",
)
