"""The one harness every benchmark runs in: the server (embedded, or
DATABASE_URL's), scratch databases on it, the server's own commit rate measured
in the same run, worker processes started and stopped, CPU from /proc, and the
run's record (server, code, machine) printed above each table and saved.

A benchmark is its measure function and its table: `run()` does the rest.
Imported as bench.harness, once a benchmark has put the project root on
sys.path (this module never imports gevent).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import platform
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg2
import psycopg2.extensions

from lib.setup import embedded
from lib.setup.settings import Settings
from lib.store.db import DB
from lib.store.migrate import migrate

ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = ROOT / ".pgdata" / "bench"
RESULTS_DIR = ROOT / "bench" / "results"

log = logging.getLogger("bench")


# ---------------------------------------------------------------- the server


@dataclass
class Server:
    url: str  # the server's own URL (its default database)
    source: str  # "DATABASE_URL" or "embedded"
    version: str = ""
    settings: dict[str, str] = field(default_factory=dict)


def get_server() -> Server:
    source = "DATABASE_URL" if os.environ.get("DATABASE_URL") else "embedded"
    return Server(embedded.database_url(Settings.from_environ(), DATA_DIR), source)


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
def scratch_database(server: Server, migrated: bool = True) -> Iterator[Scratch]:
    """A database of its own on the server, migrated unless told otherwise (a
    peer's schema, say), dropped at the end however the benchmark ends. The
    admin connection stays on the server's default database, so what it runs
    is never counted against the scratch one."""
    admin = admin_connect(server.url)
    try:
        describe(admin, server)
        name = create_database(admin)
        try:
            url = with_database(server.url, name)
            if migrated:
                migrate_database(url)
            yield Scratch(server, admin, name, url)
        finally:
            drop_database(admin, name)
    finally:
        admin.close()


def server_record(server: Server) -> dict[str, Any]:
    return {"source": server.source, "url": redact(server.url), "version": server.version, **server.settings}


class ServerMeter:
    """Transactions committed in the bench database and CPU time of the pool's
    backends, read from the admin connection (on another database, so its own
    statements do not count)."""

    def __init__(self, admin: psycopg2.extensions.connection, dbname: str) -> None:
        self.admin = admin
        self.dbname = dbname

    def _one(self, sql: str) -> Any:
        with self.admin.cursor() as cur:
            cur.execute(sql, {"db": self.dbname})
            return cur.fetchone()[0]

    def backends(self) -> list[int]:
        with self.admin.cursor() as cur:
            cur.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %(db)s AND backend_type = 'client backend'",
                {"db": self.dbname},
            )
            return [row[0] for row in cur.fetchall()]

    def xacts(self) -> int:
        """Committed and rolled back transactions of the database. A backend
        reports its last counts as it exits, a moment after it has left
        pg_stat_activity: wait for no backend, then for the count to settle."""
        deadline = time.monotonic() + 10
        while self.backends() and time.monotonic() < deadline:
            time.sleep(0.05)
        count, previous = self.xacts_reported(), -1
        while count != previous and time.monotonic() < deadline:
            time.sleep(0.2)
            count, previous = self.xacts_reported(), count
        return count

    def xacts_reported(self) -> int:
        """The count as the server has it now, without waiting: what connected
        backends did lately may not be in it yet (a busy backend reports at
        most once a second, an idle one up to 10 s after it went idle)."""
        sql = "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %(db)s"
        return int(self._one(sql))

    def cpu_seconds(self, pids: list[int]) -> float | None:
        """utime + stime of the given postgres processes, when they are on this
        machine and visible here (not for a remote or containerised server)."""
        total = 0.0
        for pid in pids:
            seconds = postgres_cpu_seconds(pid)
            if seconds is None:
                return None
            total += seconds
        return total

    def postmaster(self) -> int | None:
        """The server's postmaster, as the parent of one of the database's
        backends, when the server runs on this machine; None when no backend
        is connected or its processes are not visible here."""
        for pid in self.backends():
            stat = proc_stat(pid) if postgres_cpu_seconds(pid) is not None else None
            if stat is not None:
                return stat.parent
        return None


# ---------------------------------------------------------------- CPU from /proc

TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/<pid>/stat that CPU accounting needs, in seconds."""

    parent: int
    cpu: float  # utime + stime: the process's own threads
    children: float  # cutime + cstime: its children that have exited and been waited for


def proc_stat(pid: int) -> ProcStat | None:
    """None once the process is gone (or not visible here)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The name in parentheses may hold spaces; the fields after it are plain.
    fields = text.rpartition(")")[2].split()
    # ppid, utime, stime, cutime, cstime: fields 4, 14, 15, 16, 17 of proc(5).
    parent, utime, stime, cutime, cstime = (int(fields[i]) for i in (1, 11, 12, 13, 14))
    return ProcStat(parent, (utime + stime) / TICKS, (cutime + cstime) / TICKS)


def process_cpu_seconds(pid: int) -> float | None:
    """CPU time of a process on this machine, every thread of it; None once it is gone."""
    stat = proc_stat(pid)
    return None if stat is None else stat.cpu


def rss_mb(pid: int) -> float:
    """A process's resident memory (VmRSS), 0 once it is gone."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return 0.0
    for line in lines:
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def postgres_cpu_seconds(pid: int) -> float | None:
    """CPU time of a postgres process; None when pid is not one here."""
    try:
        if Path(f"/proc/{pid}/comm").read_text().strip() != "postgres":
            return None
    except OSError:
        return None
    return process_cpu_seconds(pid)


def server_cpu_seconds(postmaster: int) -> float | None:
    """CPU time of the whole server: the postmaster, every process it runs now
    (backends of every database, the WAL writer, the checkpointer, autovacuum)
    and those it has already waited for (the postmaster's children time), so
    that a backend that came and went between two reads is counted too."""
    root = proc_stat(postmaster)
    if root is None:
        return None
    total = root.cpu + root.children
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = proc_stat(int(entry.name))
            if stat is not None and stat.parent == postmaster:
                total += stat.cpu
    return total


@dataclass(frozen=True)
class MachineCpu:
    """Seconds of CPU time the whole machine spent, summed over its cores, from /proc/stat."""

    busy: float  # user, nice, system, irq, softirq: every process's work, this benchmark's and others'
    idle: float  # idle and iowait
    steal: float  # taken by the hypervisor for other guests: a shared VM's cores are not all its own
    # Interrupts, in busy but charged to no process: the loopback TCP between
    # client and server is handled here.
    irq: float


def machine_cpu() -> MachineCpu:
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, idle, iowait, irq, softirq = fields[:7]
    steal = fields[7] if len(fields) > 7 else 0
    busy = user + nice + system + irq + softirq
    return MachineCpu(busy / TICKS, (idle + iowait) / TICKS, steal / TICKS, (irq + softirq) / TICKS)


def processes_cpu() -> dict[int, tuple[str, float]]:
    """Every process visible here: pid -> (its command line, cut short, or its
    name; its CPU seconds): to name what else ran on the machine meanwhile."""
    seen: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        stat = proc_stat(pid)
        if stat is None:
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            command = command or (entry / "comm").read_text().strip()
        except OSError:
            continue
        # One line: a command line may hold newlines (python -c "...").
        seen[pid] = (" ".join(command.split())[:100], stat.cpu)
    return seen


# ---------------------------------------------------------------- commit rate

COMMIT_TABLE = "bench_commit"
COMMIT_SCRIPT = f"UPDATE {COMMIT_TABLE} SET n = n + 1 WHERE id = 1;\n"
_TPS = re.compile(r"^tps = ([\d.]+) \((?:without initial connection time|excluding connections establishing)\)", re.M)


@dataclass
class CommitRate:
    tps: float
    seconds: int
    pgbench: str  # the binary that ran
    version: str


def pgbench_binary() -> str:
    """pgserver's own pgbench first: it is there whenever the embedded server is.
    Found without importing pgserver, whose import warns on machines without
    XDG_RUNTIME_DIR."""
    spec = importlib.util.find_spec("pgserver")
    if spec is not None and spec.origin is not None:
        bundled = Path(spec.origin).parent / "pginstall" / "bin" / "pgbench"
        if bundled.exists():
            return str(bundled)
    found = shutil.which("pgbench")
    if found is None:
        raise SystemExit("no pgbench: neither pgserver's nor one on PATH")
    return found


def pgbench_connection(url: str) -> tuple[list[str], dict[str, str]]:
    """pgbench's connection arguments and environment for url: the same host
    (or socket folder), port, user and database our pool reaches."""
    dsn = psycopg2.extensions.parse_dsn(url)
    args: list[str] = []
    for key, flag in (("host", "-h"), ("port", "-p"), ("user", "-U")):
        if dsn.get(key):
            args += [flag, dsn[key]]
    env = {**os.environ}
    # Settings pgbench has no flag for go through libpq's environment.
    for key, var in (("password", "PGPASSWORD"), ("sslmode", "PGSSLMODE"), ("options", "PGOPTIONS")):
        if dsn.get(key):
            env[var] = dsn[key]
    ignored = set(dsn) - {"host", "port", "user", "dbname", "password", "sslmode", "options"}
    if ignored:
        log.warning("pgbench ignores these connection settings of the URL: %s", ", ".join(sorted(ignored)))
    return [*args, dsn.get("dbname", "postgres")], env


def measure_commit_rate(url: str, seconds: int) -> CommitRate:
    """tps of one client committing one small single-row UPDATE at a time,
    as our claim and finalize each commit one statement."""
    with admin_connect(url) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {COMMIT_TABLE} (id int PRIMARY KEY, n bigint NOT NULL)")
        cur.execute(f"INSERT INTO {COMMIT_TABLE} VALUES (1, 0)")
    conn.close()
    binary = pgbench_binary()
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    conn_args, env = pgbench_connection(url)
    with tempfile.NamedTemporaryFile("w", suffix=".sql") as script:
        script.write(COMMIT_SCRIPT)
        script.flush()
        command = [binary, "-c", "1", "-j", "1", "-T", str(seconds), "-n", "-f", script.name, *conn_args]
        done = subprocess.run(command, capture_output=True, text=True, env=env)
    match = _TPS.search(done.stdout)
    if done.returncode != 0 or match is None:
        raise SystemExit(f"pgbench failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return CommitRate(float(match.group(1)), seconds, binary, version)


def commit_rate(server: Server, seconds: int) -> CommitRate:
    """The server's commit rate in a scratch database of its own: every
    benchmark's results are read against it."""
    with scratch_database(server, migrated=False) as scratch:
        return measure_commit_rate(scratch.url, seconds)


@dataclass
class FsyncRate:
    ops_per_s: float  # fdatasyncs a second, one 8 kB write each
    seconds: int  # pg_test_fsync's seconds a test
    binary: str
    same_device: bool | None  # its file on the server's data directory's filesystem (None: not visible here)


_FDATASYNC = re.compile(r"\s+fdatasync\s+([\d.]+) ops/sec")


def pg_test_fsync_binary(pgbench: str) -> str:
    """pg_test_fsync of the install pgbench comes from: beside it, or, behind
    Debian's pg_wrapper, in /usr/lib/postgresql/<its major version>/bin."""
    beside = Path(pgbench).resolve().parent / "pg_test_fsync"
    if beside.exists():
        return str(beside)
    version = subprocess.run([pgbench, "--version"], capture_output=True, text=True).stdout
    major = re.search(r"\) (\d+)", version)
    debian = Path(f"/usr/lib/postgresql/{major.group(1) if major else '?'}/bin/pg_test_fsync")
    if not debian.exists():
        raise SystemExit(f"no pg_test_fsync beside {pgbench} nor at {debian}")
    return str(debian)


def fdatasync_rate(pgbench: str, seconds: int, server: Server) -> FsyncRate:
    """The disk's flush rate as the server's WAL meets it: pg_test_fsync's
    fdatasync of one 8 kB write (Linux's default wal_sync_method), on a
    temporary file, stopped once that line is out."""
    binary = pg_test_fsync_binary(pgbench)
    with tempfile.TemporaryDirectory(prefix="jobs-fsync-") as folder:
        command = [binary, "-s", str(seconds), "-f", str(Path(folder) / "probe")]
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        found, lines = None, []
        try:
            for line in proc.stdout:  # type: ignore[union-attr]
                lines.append(line)
                found = _FDATASYNC.match(line)
                if found:
                    break
        finally:
            proc.terminate()
            proc.wait()
        if found is None:
            raise SystemExit(f"pg_test_fsync printed no fdatasync rate:\n{''.join(lines)[-2000:]}")
        with admin_connect(server.url) as conn, conn.cursor() as cur:
            cur.execute("SHOW data_directory")
            data = Path(cur.fetchone()[0])
        conn.close()
        same = os.stat(data).st_dev == os.stat(folder).st_dev if data.exists() else None
    return FsyncRate(float(found.group(1)), seconds, binary, same)


# ---------------------------------------------------------------- reading the server


def backends(admin: psycopg2.extensions.connection, dbname: str) -> int:
    """Client connections to dbname now."""
    with admin.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND backend_type = 'client backend'", (dbname,)
        )
        return int(cur.fetchone()[0])


class ConnectionSampler:
    """The most connections the database held, sampled from a thread over a
    connection of its own (to the server's default database, never counted)."""

    def __init__(self, server_url: str, dbname: str, every: float) -> None:
        self.server_url, self.dbname, self.every = server_url, dbname, every
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        conn = admin_connect(self.server_url)
        try:
            while not self._stop.is_set():
                self.peak = max(self.peak, backends(conn, self.dbname))
                self._stop.wait(self.every)
        finally:
            conn.close()

    def __enter__(self) -> ConnectionSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def query_one(url: str, sql: str, params: Any = None) -> tuple[Any, ...]:
    """One row of one statement, on a short autocommit connection of the benchmark's own."""
    conn = admin_connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchone()
    finally:
        conn.close()


def vacuum_analyze(url: str) -> None:
    """Planner statistics and the visibility map as autovacuum would leave them
    after an enqueue, for every run alike."""
    conn = admin_connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute("VACUUM ANALYZE")
    finally:
        conn.close()


def wait_until(predicate: Callable[[], Any], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting: {what}")
        time.sleep(0.05)


# ---------------------------------------------------------------- worker processes

STOP_TIMEOUT = 60.0


@dataclass
class WorkerProcess:
    """A worker process of a benchmark, its output in log_file. The worker
    apps of bench/apps/ write done_file once --target handlers have started,
    and each start to starts_file as they stop."""

    proc: subprocess.Popen[bytes]
    log_file: Path
    done_file: Path | None = None
    starts_file: Path | None = None

    def log_tail(self) -> str:
        return self.log_file.read_text(errors="replace")[-3000:] if self.log_file.exists() else ""

    def stop(self) -> int:
        """SIGTERM, as a deployment stops a worker; killed if it outstays STOP_TIMEOUT. Its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def starts(self) -> dict[int, float]:
        if self.starts_file is None or not self.starts_file.exists():
            return {}
        return {int(seq): t for seq, t in json.loads(self.starts_file.read_text())}


def spawn(command: list[str], env: dict[str, str], log_file: Path) -> WorkerProcess:
    with log_file.open("wb") as log:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    return WorkerProcess(proc, log_file)


@contextmanager
def worker(command: list[str], env: dict[str, str], work: Path, target: int) -> Iterator[WorkerProcess]:
    """A bench/apps/ worker process with its done and starts files in work,
    stopped at the end however the block ends."""
    done_file, starts_file = work / "done", work / "starts.json"
    for path in (done_file, starts_file):
        path.unlink(missing_ok=True)
    command = [*command, "--target", str(target), "--done-file", str(done_file), "--starts-file", str(starts_file)]
    run = spawn(command, env, work / "worker.log")
    run.done_file, run.starts_file = done_file, starts_file
    try:
        yield run
    finally:
        run.stop()


def stop_all(runs: list[WorkerProcess]) -> None:
    """SIGTERM to every process at once, then wait for each."""
    for run in runs:
        if run.proc.poll() is None:
            run.proc.send_signal(signal.SIGTERM)
    for run in runs:
        run.stop()


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


def header_lines(result: dict[str, Any]) -> list[str]:
    """What every table starts with: the server, the code, the commit rate, the machine."""
    rate = result["commit_rate"]
    return [
        *context_lines(result),
        f"commit rate  {rate['tps']:,.0f} tx/s ({rate['version']}, -c 1 -j 1 -T {rate['seconds']},"
        " one single-row UPDATE a commit)",
        machine_line(result),
    ]


def add_pgbench_seconds(parser: argparse.ArgumentParser, default: int = 10) -> None:
    parser.add_argument(
        "--pgbench-seconds", type=int, default=default, help="the commit rate's pgbench run (default %(default)s)"
    )


def run(
    name: str,
    args: argparse.Namespace,
    measure: Callable[[Server, CommitRate], dict[str, Any]],
    print_table: Callable[[dict[str, Any]], None],
) -> int:
    """A benchmark's whole run: the machine's load average before anything
    runs, the server (started if it is the embedded one), its commit rate,
    measure's results, the table under the run's header, and the record
    saved to bench/results/. The project's own logging at WARNING only."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    load_at_start = load_average()
    server = get_server()
    started = time.monotonic()
    print(f"pgbench: {args.pgbench_seconds} s of single-row commits ...", flush=True)
    rate = commit_rate(server, args.pgbench_seconds)
    found = measure(server, rate)
    result = {
        **run_record(server, load_at_start),
        "options": vars(args),
        "commit_rate": asdict(rate),
        **found,
        "seconds": time.monotonic() - started,
    }
    print()
    print("\n".join(header_lines(result)))
    print_table(result)
    print(f"\ntook {result['seconds'] / 60:.1f} min; saved {save(result, name).relative_to(ROOT)}")
    return 0
