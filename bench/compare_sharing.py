"""The workloads of bench/compare.py that applications sharing the database
bring, for every side:

  7.       16 application processes enqueuing at once, one job a
           transaction each, for --seconds (10), no worker running: jobs
           committed a second by all 16, beside the same 16 clients' one-row
           INSERT into a plain table (what the server allows), run right
           after in the same database; for ours also the INSERT of the job
           row alone (what the row and its indexes allow). Ours is bench/enqueue_concurrency.py's
           lib.insert run (bench/apps/sharing_enqueue.py, BEGIN; lib.insert;
           COMMIT); each peer its own enqueue call (bench/apps/compare_*.py
           burst), every process starting once all 16 are ready.
  horizon. the 40-queue workload (3) with a transaction another session holds
           open for the whole run (BEGIN; SELECT txid_current(); held by
           bench/held_horizon.py's Hold: a transaction id, so no row version
           any side leaves from then on can be cleaned away), and the same
           run clean, one after the other in every round; the held run's
           jobs a second over the clean one's.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench import enqueue_concurrency
from bench.compare_sides import Setting, Side
from bench.harness import ROOT, Server, admin_connect, scratch_database
from bench.held_horizon import Hold
from bench.sharing import start_clients

CLIENTS = 16
PLAIN_TABLE = "CREATE TABLE bench_plain (id bigserial PRIMARY KEY, queue text NOT NULL, args jsonb NOT NULL)"
# Sixteen processes of a peer importing its library and connecting, on a busy 2-core machine.
READY_TIMEOUT = 180.0
# From the last process ready to the window's start: time for each to read the go file.
GO_AFTER = 0.5


@dataclass
class Burst:
    clients: int
    seconds: float
    jobs: int = 0  # committed inside the window by all clients
    jobs_per_s: float = 0.0
    plain_per_s: float = 0.0  # the same clients' one-row INSERT into a plain table
    of_plain: float | None = None  # jobs_per_s over plain_per_s
    # Ours: the same clients' INSERT of a job row alone (jobs_insert's own
    # INSERT, prepared, no function, no trigger): what the row and its
    # indexes allow, before lib.insert's call.
    row_alone_per_s: float | None = None
    ready_seconds: float | None = None  # a peer's: from the first spawn to the last process ready


def measure_burst(side: Side, server: Server, clients: int, seconds: float) -> Burst:
    """clients processes of the side enqueuing into one queue for seconds,
    then the same number of plain INSERT clients, in one fresh database."""
    result = Burst(clients, seconds)
    with scratch_database(server, side.migrated) as scratch:
        side.install(scratch.url)
        if side.name == "ours":
            result.jobs = enqueue_concurrency.one_run(scratch.url, "lib", clients, 1, seconds)["jobs"]
            result.row_alone_per_s = enqueue_concurrency.one_run(scratch.url, "plain", clients, 1, seconds)["per_s"]
        else:
            result.jobs, result.ready_seconds = peer_burst(side, scratch.url, clients, seconds)
        result.plain_per_s = plain_rate(scratch.url, clients, seconds)
    result.jobs_per_s = result.jobs / seconds
    result.of_plain = result.jobs_per_s / result.plain_per_s if result.plain_per_s else None
    return result


def plain_rate(url: str, clients: int, seconds: float) -> float:
    """Rows a second that clients commit into a plain table, one a transaction."""
    conn = admin_connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute(PLAIN_TABLE)
    finally:
        conn.close()
    run = start_clients("table", url, clients, ["q00"], seconds=seconds)
    writes = run.wait(seconds + 60)
    return writes.committed(run.start_at, run.start_at + seconds) / seconds


def peer_burst(side: Side, url: str, clients: int, seconds: float) -> tuple[int, float]:
    """A peer's enqueue processes in burst mode: (jobs committed inside the
    window, seconds until every process was ready)."""
    with tempfile.TemporaryDirectory(prefix="jobs-burst-") as folder:
        work = Path(folder)
        go = work / "go"
        began = time.monotonic()
        procs = []
        for n in range(clients):
            command = [
                *side.enqueue_command("burst", url, ["q00"], 0),
                *("--seconds", str(seconds), "--ready-file", str(work / f"ready{n}"), "--go-file", str(go)),
            ]
            with (work / f"out{n}").open("wb") as out, (work / f"err{n}").open("wb") as err:
                procs.append(subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=err))
        try:
            ready = wait_ready(procs, work, began)
            # Written whole, then renamed: a process never reads half a time.
            (work / "go.tmp").write_text(f"{time.time() + GO_AFTER:.6f}")
            (work / "go.tmp").rename(go)
            for proc in procs:
                proc.wait(seconds + GO_AFTER + 60)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        failed = [n for n, proc in enumerate(procs) if proc.returncode != 0]
        if failed:
            raise RuntimeError(f"{side.name} burst client failed:\n{(work / f'err{failed[0]}').read_text()[-3000:]}")
        jobs = sum(json.loads((work / f"out{n}").read_text())["jobs"] for n in range(clients))
    return jobs, ready


def wait_ready(procs: list[subprocess.Popen[bytes]], work: Path, began: float) -> float:
    """Seconds until every process has written its ready file; RuntimeError if one exits first."""
    deadline = began + READY_TIMEOUT
    while not all((work / f"ready{n}").exists() for n in range(len(procs))):
        for n, proc in enumerate(procs):
            if proc.poll() is not None:
                raise RuntimeError(f"burst client {n} exited with {proc.returncode}:\n{(work / f'err{n}').read_text()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"burst clients not ready within {READY_TIMEOUT:g} s")
        time.sleep(0.05)
    return time.monotonic() - began


# ---------------------------------------------------------------- the held horizon


@contextmanager
def held(url: str, on: bool) -> Iterator[None]:
    """When on, a transaction id held on a connection of its own for the block."""
    hold = Hold(url, "xid") if on else None
    try:
        yield
    finally:
        if hold is not None:
            hold.release()


def horizon_settings(setting: Setting) -> list[Setting]:
    """The side's 40-queue setting, clean and held, both run every round."""
    return [
        replace(setting, label=f"{setting.label}, clean"),
        replace(setting, label=f"{setting.label}, held", hold=True),
    ]


@dataclass
class Horizon:
    clean_jobs_per_s: float | None
    held_jobs_per_s: float | None
    ratio: float | None  # the median of the rounds' held over clean
    ratios: list[float | None]
    complete: bool


def horizon_summary(pairs: list[tuple[Any, Any]]) -> Horizon:
    """(clean, held) Throughputs of each round: held over clean round by round, and their medians."""
    ratios = [held_run.jobs_per_s / clean.jobs_per_s if clean.jobs_per_s else None for clean, held_run in pairs]
    known = [r for r in ratios if r is not None]
    return Horizon(
        clean_jobs_per_s=statistics.median(clean.jobs_per_s for clean, _ in pairs) if pairs else None,
        held_jobs_per_s=statistics.median(held_run.jobs_per_s for _, held_run in pairs) if pairs else None,
        ratio=statistics.median(known) if known else None,
        ratios=ratios,
        complete=all(clean.complete and held_run.complete for clean, held_run in pairs),
    )


def print_notes(result: dict[str, Any], names: list[str], make_side: Callable[[str, str], Side]) -> None:
    """Under compare.py's table: what a side cannot do, the plain INSERT
    beside each side's enqueuers, and the held horizon round by round."""
    for name in names:
        cannot = make_side(name, "").batch_enqueue
        if cannot and "5" in result["sides"][name]["medians"]:
            print(f"  {name}, enqueue in batches: none ({cannot})")
    sides = {n: result["sides"][n]["medians"] for n in names}
    bursts = {n: found["7"] for n, found in sides.items() if found.get("7")}
    if bursts:
        print(
            f"  {CLIENTS} enqueuers, the same {CLIENTS} clients' one-row INSERT into a plain table right after"
            " (rows/s): " + ", ".join(f"{n} {b['plain_per_s']:,.0f}" for n, b in bursts.items())
        )
    for name, burst in bursts.items():
        if burst.get("row_alone_per_s") and burst["plain_per_s"]:
            alone = burst["row_alone_per_s"]
            print(
                f"  {CLIENTS} enqueuers, {name}: the job row alone (its INSERT prepared, no function, no trigger):"
                f" {alone:,.0f} rows/s, {alone / burst['plain_per_s']:.2f} of the plain table's;"
                f" the enqueue {burst['jobs_per_s'] / alone:.2f} of it"
            )
    horizons = {n: found["horizon"] for n, found in sides.items() if found.get("horizon")}
    for name, found in horizons.items():
        each = ", ".join("-" if r is None else f"{r:.2f}" for r in found["ratios"])
        flag = "" if found["complete"] else "; INCOMPLETE"
        print(
            f"  xid held, {name}: clean {found['clean_jobs_per_s'] or 0:,.0f} jobs/s, held"
            f" {found['held_jobs_per_s'] or 0:,.0f}; held over clean round by round {each}{flag}"
        )
