"""A private Postgres that chaos tests may restart and cut connections of.

The rest of the suite may share a server (DATABASE_URL) that must never be
restarted, so a chaos test gets its own: pgserver's bundled Postgres in a data
folder under a temporary directory, listening on a Unix socket only, stopped
(and its folder removed) at the end. Any test file can use it:

    @pytest.fixture(scope="module")
    def chaos_server():
        with ChaosServer() as server:
            yield server

The folder is not under pytest's tmp_path: as root Postgres runs as another
user, and every pytest session that starts meanwhile makes its
/tmp/pytest-of-<user> private again, which locks the server out of its files.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import time
import uuid
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import psycopg2

log = logging.getLogger("tests.chaos_server")

# Seconds pg_ctl may take to stop or start the server before the test fails.
PG_CTL_TIMEOUT = 60


def _import_pgserver() -> Any:
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset, as it is on CI.
        warnings.simplefilter("ignore")
        import pgserver

    return pgserver


class ChaosServer:
    """One private server: url, restart(), terminate_backends(), stop()."""

    def __init__(self, base_dir: Path | None = None) -> None:
        """A server in base_dir/pgdata; without base_dir, in a new temporary
        folder that stop() removes."""
        pgserver = _import_pgserver()
        self._owned_dir: Path | None = None
        if base_dir is None:
            base_dir = self._owned_dir = Path(tempfile.mkdtemp(prefix="jobs-chaos-"))
        self.pgdata = (base_dir / "pgdata").resolve()
        self.pgdata.mkdir(parents=True, exist_ok=True)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._server = pgserver.get_server(self.pgdata, cleanup_mode="stop")
        except BaseException:
            self._remove_dir()
            raise
        # As root pgserver runs Postgres as its own system user; pg_ctl must
        # run as that user too, or Postgres refuses.
        self._user: str | None = self._server.system_user
        self._pgserver = pgserver
        self._pg_ctl = pgserver._commands.pg_ctl
        self.url: str = self._server.get_uri()
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
        if down_seconds <= 0:
            # pg_ctl restart reuses the options of the last start
            # (postmaster.opts), the socket folder included.
            self._ctl(["-w", "-m", "fast", "-l", str(self.pgdata / "log"), "restart"])
        else:
            self._ctl(["-w", "-m", "fast", "stop"])
            time.sleep(down_seconds)
            socket_dir = parse_qs(urlsplit(self.url).query)["host"][0]
            self._ctl(["-w", "-o", '-h ""', "-o", f"-k {socket_dir}", "-l", str(self.pgdata / "log"), "start"])
        self.restarts += 1
        self._follow_postmaster()

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
        """Stop the server and release pgserver's handle; safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        self._follow_postmaster()
        # pgserver stops the server when this process holds its last handle.
        self._server.cleanup()
        if (self.pgdata / "postmaster.pid").exists():
            # It did not (another handle, or a restart that went wrong): the
            # server must not outlive the test.
            try:
                self._ctl(["-w", "-m", "immediate", "stop"])
            except subprocess.CalledProcessError as exc:
                log.warning("pg_ctl stop failed: %s", exc)
        self._remove_dir()

    def _remove_dir(self) -> None:
        if self._owned_dir is not None:
            shutil.rmtree(self._owned_dir, ignore_errors=True)

    def _follow_postmaster(self) -> None:
        """Point pgserver's handle at the running postmaster: after a restart
        it would still watch the first one, and at cleanup try to stop (and
        then kill) a process that is gone."""
        info = self._pgserver.utils.PostmasterInfo.read_from_pgdata(self.pgdata)
        if info is not None:
            self._server._postmaster_info = info

    def _ctl(self, args: list[str]) -> None:
        self._pg_ctl(args, pgdata=self.pgdata, user=self._user, timeout=PG_CTL_TIMEOUT)

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
