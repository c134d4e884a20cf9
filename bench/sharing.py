"""What the benchmarks of a database shared with applications share
(enqueue_concurrency.py, live_upgrade.py, held_horizon.py): the enqueuing
application's processes (bench/apps/sharing_enqueue.py), started together and
read back; latencies summed up; the server settings that decide when dead
rows are cleaned away.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg2.extensions

from bench.harness import ROOT, percentile

APP = ROOT / "bench" / "apps" / "sharing_enqueue.py"
# Seconds for a client process to start and connect, on a busy 2-core machine.
START_EACH = 0.25
START_BASE = 1.0


@dataclass
class Writes:
    """Every write of one or more clients, in the app's terms: when each began
    (time.time()), how long it took, the id written (None: none), and the
    errors, [at, sqlstate, message]."""

    began: list[float] = field(default_factory=list)
    took: list[float] = field(default_factory=list)
    ids: list[int | None] = field(default_factory=list)
    errors: list[list[Any]] = field(default_factory=list)

    def add(self, other: dict[str, Any]) -> None:
        self.began += other["began"]
        self.took += other["took"]
        self.ids += other["ids"]
        self.errors += other["errors"]

    def committed(self, start: float, end: float) -> int:
        """Writes that began and ended inside [start, end] and wrote a row."""
        return sum(
            1 for b, t, i in zip(self.began, self.took, self.ids, strict=True) if b >= start and b + t <= end and i
        )


@dataclass
class Clients:
    """Client processes of the app, each with its output file."""

    procs: list[subprocess.Popen[bytes]]
    outputs: list[Path]
    folder: tempfile.TemporaryDirectory[str]
    start_at: float

    def wait(self, timeout: float) -> Writes:
        """Every client's writes, once all have ended (killed past timeout)."""
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return self._read()

    def stop(self) -> Writes:
        """SIGTERM to every client (each ends after its write in progress); their writes."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        return self.wait(30.0)

    def _read(self) -> Writes:
        writes = Writes()
        try:
            for proc, path in zip(self.procs, self.outputs, strict=True):
                text = path.read_text()
                if proc.returncode != 0 or not text:
                    raise RuntimeError(f"an enqueue client exited with {proc.returncode}:\n{text[-3000:]}")
                writes.add(json.loads(text))
        finally:
            self.folder.cleanup()
        return writes


def start_clients(
    mode: str, url: str, clients: int, queues: list[str], *, seconds: float = 0.0, every: float = 0.0
) -> Clients:
    """clients processes of the app writing in mode, all from the same moment
    on (once every one has had time to start and connect), for seconds (0:
    until stopped), a write every `every` seconds each (0: back to back)."""
    folder = tempfile.TemporaryDirectory(prefix="jobs-sharing-")
    start_at = time.time() + START_BASE + START_EACH * clients
    procs, outputs = [], []
    for client in range(clients):
        out = Path(folder.name) / f"client{client}.json"
        command = [
            sys.executable,
            str(APP),
            mode,
            "--url",
            url,
            "--queues",
            ",".join(queues),
            "--client",
            str(client),
            "--start-at",
            f"{start_at:.6f}",
            "--seconds",
            str(seconds),
            "--every",
            str(every),
        ]
        with out.open("wb") as stdout:
            procs.append(subprocess.Popen(command, cwd=ROOT, env=dict(os.environ), stdout=stdout))
        outputs.append(out)
    return Clients(procs, outputs, folder, start_at)


def latency_ms(took: list[float]) -> dict[str, float | None]:
    """p50, p99 and the longest of a list of seconds, in milliseconds."""
    if not took:
        return {"p50": None, "p99": None, "max": None}
    ms = [1000 * t for t in took]
    return {"p50": percentile(ms, 50), "p99": percentile(ms, 99), "max": max(ms)}


def vacuum_settings(admin: psycopg2.extensions.connection) -> dict[str, str]:
    """Whether and how often the server vacuums by itself: with autovacuum
    off (as on some shared machines), dead rows stay until a VACUUM."""
    found = {}
    with admin.cursor() as cur:
        for name in ("autovacuum", "autovacuum_naptime", "autovacuum_vacuum_scale_factor"):
            cur.execute(f"SHOW {name}")
            found[name] = cur.fetchone()[0]
    return found


def vacuum_line(settings: dict[str, str]) -> str:
    return (
        f"vacuum       autovacuum={settings['autovacuum']} naptime={settings['autovacuum_naptime']}"
        f" scale_factor={settings['autovacuum_vacuum_scale_factor']}"
    )
