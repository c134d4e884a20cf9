"""What the benchmarks share: the server they run on, a scratch database on it,
and the record of a run (server, code, machine) saved with every result.

Imported as bench.common, once a benchmark has put the project root on
sys.path (and monkey-patched, if it uses gevent: this module never imports it).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg2
import psycopg2.extensions

from lib import embedded
from lib.db import DB
from lib.migrate import migrate

ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = ROOT / ".pgdata" / "bench"
RESULTS_DIR = ROOT / "bench" / "results"


# ---------------------------------------------------------------- the server


@dataclass
class Server:
    url: str  # the server's own URL (its default database)
    source: str  # "DATABASE_URL" or "embedded"
    version: str = ""
    settings: dict[str, str] = field(default_factory=dict)


def get_server() -> Server:
    source = "DATABASE_URL" if os.environ.get("DATABASE_URL") else "embedded"
    return Server(embedded.database_url(DATA_DIR), source)


def with_database(url: str, name: str) -> str:
    """url pointing at another database of the same server."""
    if "://" not in url:  # a keyword DSN: a later dbname wins
        return f"{url} dbname={name}"
    return urlunsplit(urlsplit(url)._replace(path="/" + name))


def redact(url: str) -> str:
    """url without its password, for the printed and stored results."""
    parts = urlsplit(url)
    if "://" not in url or not parts.password:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def admin_connect(url: str) -> psycopg2.extensions.connection:
    conn = psycopg2.connect(url, application_name="jobs-bench")
    conn.autocommit = True
    return conn


def describe(admin: psycopg2.extensions.connection, server: Server) -> None:
    """The server's version and the settings that decide what a commit costs."""
    with admin.cursor() as cur:
        cur.execute("SHOW server_version")
        server.version = cur.fetchone()[0]
        for name in ("synchronous_commit", "fsync", "wal_sync_method", "ssl"):
            cur.execute(f"SHOW {name}")
            server.settings[name] = cur.fetchone()[0]


def create_database(admin: psycopg2.extensions.connection) -> str:
    name = f"jobs_bench_{uuid.uuid4().hex[:10]}"
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name}")
    return name


def drop_database(admin: psycopg2.extensions.connection, name: str) -> None:
    with admin.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def migrate_database(url: str) -> None:
    migrator = DB.connect(url, size=1)
    try:
        migrate(migrator)
    finally:
        migrator.close()


@dataclass
class Scratch:
    server: Server
    admin: psycopg2.extensions.connection  # autocommit, on the server's default database
    name: str  # the scratch database
    url: str  # the scratch database's URL


@contextmanager
def scratch_database(server: Server) -> Iterator[Scratch]:
    """A migrated database of its own on the server, dropped at the end however
    the benchmark ends. The admin connection stays on the server's default
    database, so what it runs is never counted against the scratch one."""
    admin = admin_connect(server.url)
    try:
        describe(admin, server)
        name = create_database(admin)
        try:
            url = with_database(server.url, name)
            migrate_database(url)
            yield Scratch(server, admin, name, url)
        finally:
            drop_database(admin, name)
    finally:
        admin.close()


def server_record(server: Server) -> dict[str, Any]:
    return {"source": server.source, "url": redact(server.url), "version": server.version, **server.settings}


# ---------------------------------------------------------------- the run's record


def revision() -> dict[str, Any] | None:
    """The commit measured, and whether the code under it had local changes:
    a number means little without the code it came from."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        changes = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--", "lib", "sql", "worker.py"],
            capture_output=True,
            text=True,
        )
    except OSError:
        return None
    if head.returncode != 0:
        return None
    return {"commit": head.stdout.strip(), "local_changes": bool(changes.stdout.strip())}


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def machine(load_at_start: float) -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        # Other work on the machine shows here first; a busy machine makes every number noisy.
        "load_average_1m": {"start": load_at_start, "end": load_average()},
    }


def timestamp() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def run_record(server: Server, load_at_start: float) -> dict[str, Any]:
    """What every result starts with: when, on which server, which code, which machine."""
    return {
        "timestamp": timestamp(),
        "server": server_record(server),
        "revision": revision(),
        "machine": machine(load_at_start),
    }


def context_lines(result: dict[str, Any]) -> list[str]:
    """The server, its commit settings and the code, as the tables print them."""
    server = result["server"]
    lines = [
        f"server       PostgreSQL {server['version']} ({server['source']}: {server['url']})",
        f"settings     synchronous_commit={server['synchronous_commit']} fsync={server['fsync']}"
        f" wal_sync_method={server['wal_sync_method']} ssl={server['ssl']}",
    ]
    rev = result["revision"]
    if rev:
        dirty = " with uncommitted changes to lib/, sql/ or worker.py" if rev["local_changes"] else ""
        lines.append(f"code         commit {rev['commit']}{dirty}")
    return lines


def machine_line(result: dict[str, Any]) -> str:
    machine_ = result["machine"]
    load = machine_["load_average_1m"]
    return f"machine      {machine_['cpus']} cpus, load average {load['start']} at start, {load['end']} at end"


def save(result: dict[str, Any], bench: str) -> Path:
    """bench/results/<bench>-<UTC time>.json (ignored by git)."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = RESULTS_DIR / f"{bench}-{stamp}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile (0-100) by linear interpolation between closest ranks."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
