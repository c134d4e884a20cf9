"""A private Postgres that chaos tests may restart and cut connections of.

The rest of the suite may share a server (DATABASE_URL) that must never be
restarted, so a chaos test gets its own: the embedded server (lib.setup.embedded)
in a data folder under a temporary directory, listening on a Unix socket
only, stopped (and its folder removed) at the end. Any test file can use it:

    @pytest.fixture(scope="module")
    def chaos_server():
        with ChaosServer() as server:
            yield server

The folder is not under pytest's tmp_path: as root Postgres runs as another
user, and every pytest session that starts meanwhile makes its
/tmp/pytest-of-<user> private again, which locks the server out of its files.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg2

from lib.setup import embedded
from lib.setup.settings import Settings


class ChaosServer:
    """One private server: url, restart(), terminate_backends(), stop()."""

    def __init__(self, base_dir: Path | None = None) -> None:
        """A server in base_dir/pgdata; without base_dir, in a new temporary
        folder that stop() removes."""
        self._owned_dir: Path | None = None
        if base_dir is None:
            base_dir = self._owned_dir = Path(tempfile.mkdtemp(prefix="jobs-chaos-"))
            # As root the server runs as postgres, which must pass through.
            base_dir.chmod(0o711)
        self.pgdata = (base_dir / "pgdata").resolve()
        # The binaries JOBS_EMBEDDED names, as the worker would take them.
        self.source = Settings.from_environ().embedded
        try:
            self.url: str = embedded.start(self.pgdata, self.source)
        except BaseException:
            self._remove_dir()
            raise
        self.restarts = 0
        self._stopped = False

    def database(self, prefix: str = "chaos") -> str:
        """The URL of a new, empty database on this server (kept until stop())."""
        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        self.execute(f"CREATE DATABASE {name}")
        parts = urlsplit(self.url)
        return urlunsplit(parts._replace(path="/" + name))

    def execute(self, sql: str, params: tuple[Any, ...] | None = None) -> list[tuple[Any, ...]]:
        """Run one statement on a connection of its own (a restart may have
        killed any older one); its rows, if it returns any."""
        conn = psycopg2.connect(self.url, application_name="chaos-server", connect_timeout=10)
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(sql, params)
                return cur.fetchall() if cur.description else []
        finally:
            conn.close()

    def restart(self, down_seconds: float = 0.0) -> None:
        """Stop the server (fast: sessions are cut, as in a failover), leave it
        down for down_seconds (connections are refused meanwhile), and start it
        again on the same socket; returns once it accepts connections."""
        embedded.stop(self.pgdata)
        time.sleep(down_seconds)
        # Same socket, so clients reconnect by the URL they hold: a short path
        # keeps its socket in the data folder (a long one would get a new
        # folder in /tmp).
        assert embedded.start(self.pgdata, self.source) == self.url
        self.restarts += 1

    def crash_restart(self) -> None:
        """As `pg_ctl restart -m immediate`: SIGQUIT to the postmaster, so
        every session is cut at once with no checkpoint, then a start that
        replays the WAL; returns once it accepts connections."""
        for pidfile in self.pgdata.glob("*/postmaster.pid"):
            os.kill(int(pidfile.read_text().split()[0]), signal.SIGQUIT)
            deadline = time.monotonic() + 30
            while pidfile.exists():
                assert time.monotonic() < deadline, f"the server did not stop on SIGQUIT ({pidfile})"
                time.sleep(0.02)
        self.restart()

    def terminate_backends(self, application_name_like: str | None = None, limit: int | None = None) -> int:
        """pg_terminate_backend on client sessions (other than this call's
        own), those whose application_name is LIKE the pattern when given, at
        most limit of them picked at random; how many were terminated."""
        rows = self.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM ("
            " SELECT pid FROM pg_stat_activity"
            " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
            "   AND (%s::text IS NULL OR application_name LIKE %s::text)"
            " ORDER BY random() LIMIT %s) picked",
            (application_name_like, application_name_like, limit),
        )
        return int(rows[0][0])

    def stop(self) -> None:
        """Stop the server; safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        embedded.stop(self.pgdata)
        self._remove_dir()

    def _remove_dir(self) -> None:
        if self._owned_dir is not None:
            shutil.rmtree(self._owned_dir, ignore_errors=True)

    def __enter__(self) -> ChaosServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def worker_env(url: str, **extra: str) -> dict[str, str]:
    """The environment of a worker subprocess on a chaos database: never the
    suite's DATABASE_URL, never a Sentry DSN."""
    env = {k: v for k, v in os.environ.items() if k not in ("SENTRY_DSN",)}
    env.update({"DATABASE_URL": url, **extra})
    return env
