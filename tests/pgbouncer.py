"""A PgBouncer of the tests' own, in transaction mode, in front of the suite's
server: the way many deployments reach Postgres, where a client's
transactions may each run on a different server connection.

    with PgBouncer(server_url) as bouncer:
        url = bouncer.url("some_database")

It listens on a free TCP port of 127.0.0.1 only, lets any client in (no
auth: its [databases] entry logs in to the server as the server URL's user),
and serves every database of that server through one wildcard entry, so the
scratch databases the tests create are reachable without a reload. Its config,
log and pidfile live in a temporary folder that stop() removes.

PgBouncer refuses to run as root: as root it is told to drop to the machine's
`postgres` user (the config's `user =`), who owns the folder. The embedded
server, run as root, belongs to that same user, so its Unix socket is within
reach; the machine's PostgreSQL is reached over TCP.

Not under pytest's tmp_path, for the reason tests/chaos_server.py gives: as
root the process runs as another user, and every pytest session that starts
meanwhile makes /tmp/pytest-of-<user> private again.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg2

BINARY = "/usr/sbin/pgbouncer"
# PgBouncer drops to this user when started as root (it will not run as root).
RUN_AS = "postgres"
START_TIMEOUT = 15.0
# A port found free may be taken before PgBouncer binds it: tried again on another.
START_TRIES = 3


class PgBouncerError(RuntimeError):
    """PgBouncer did not start; the message holds the tail of its log."""


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def backend_of(server_url: str) -> dict[str, str]:
    """host (a socket folder or an address), port, user, password and database
    of the server, as libpq resolved them on a real connection: a URL that
    leaves the host or the user out still names the server it reaches."""
    conn = psycopg2.connect(server_url, connect_timeout=10)
    try:
        info = conn.info
        found = {"host": info.host, "port": str(info.port), "user": info.user, "dbname": info.dbname}
        if info.password:
            found["password"] = info.password
        return found
    finally:
        conn.close()


def _quoted(value: str) -> str:
    """A value of a [databases] connection string, quoted (PgBouncer doubles a quote)."""
    return "'" + value.replace("'", "''") + "'"


class PgBouncer:
    """One PgBouncer process: url(database), admin(), log_tail(), stop()."""

    def __init__(self, server_url: str, *, pool_mode: str = "transaction") -> None:
        if not os.access(BINARY, os.X_OK):
            raise FileNotFoundError(BINARY)
        self.backend = backend_of(server_url)
        self.pool_mode = pool_mode
        self.dir = Path(tempfile.mkdtemp(prefix="jobs-pgbouncer-"))
        self.run_as = pwd.getpwnam(RUN_AS) if os.geteuid() == 0 else None
        if self.run_as is not None:
            # PgBouncer writes its log and pidfile here after it has dropped to
            # that user, and reads its config again on a reload.
            os.chown(self.dir, self.run_as.pw_uid, self.run_as.pw_gid)
        self.config = self.dir / "pgbouncer.ini"
        self.logfile = self.dir / "pgbouncer.log"
        self.pidfile = self.dir / "pgbouncer.pid"
        self.output = self.dir / "output.log"  # its stderr
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def url(self, database: str) -> str:
        """A URL of that database through PgBouncer. The user is a name only:
        with no auth, the server session is the [databases] entry's user."""
        return f"postgresql://{self.backend['user']}@127.0.0.1:{self.port}/{database}"

    def admin(self) -> psycopg2.extensions.connection:
        """A connection to PgBouncer's admin console (SHOW POOLS, SHOW CLIENTS),
        in autocommit: the console takes no transaction blocks."""
        conn = psycopg2.connect(self.url("pgbouncer"), connect_timeout=5)
        conn.autocommit = True
        return conn

    def show(self, what: str) -> list[dict[str, object]]:
        """The rows of SHOW <what> on the admin console, as column -> value."""
        conn = self.admin()
        try:
            with conn.cursor() as cur:
                cur.execute(f"SHOW {what}")
                names = [c.name for c in cur.description]
                return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
        finally:
            conn.close()

    def warm(self, database: str, sessions: int = 4) -> set[int]:
        """Open that many server sessions to the database (transactions held
        open at once make PgBouncer open one each), left idle in its pool: with
        server_round_robin a client's next transactions then land on one after
        another, so a statement that relies on an earlier one's session fails
        at once rather than when the pool happens to grow. The server process
        ids."""
        conns = [psycopg2.connect(self.url(database), connect_timeout=5) for _ in range(sessions)]
        try:
            pids = set()
            for conn in conns:  # each stays in its transaction until all are in theirs
                with conn.cursor() as cur:
                    cur.execute("SELECT pg_backend_pid()")
                    pids.add(cur.fetchone()[0])
            for conn in conns:
                conn.commit()
            return pids
        finally:
            for conn in conns:
                conn.close()

    def forget(self, database: str) -> None:
        """Close PgBouncer's connections to that database (its console's KILL),
        before it is dropped: a drop that ends them itself leaves PgBouncer
        warning of crashed server connections."""
        conn = self.admin()
        try:
            with conn.cursor() as cur:
                cur.execute(f'KILL "{database}"')
        finally:
            conn.close()

    def log_tail(self, lines: int = 30) -> str:
        """The last lines it printed: its log goes to stderr too, along with
        what it says before the logfile is open (a bad config, say)."""
        for path in (self.output, self.logfile):
            if path.exists() and path.stat().st_size:
                return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        return "(nothing logged)"

    def _write_config(self) -> None:
        backend = " ".join(
            f"{key}={_quoted(value)}"
            for key, value in self.backend.items()
            if key in ("host", "port", "user", "password")
        )
        settings = {
            "listen_addr": "127.0.0.1",
            "listen_port": str(self.port),
            # No Unix socket: the default puts one in /tmp, where any local
            # user could reach the server through it.
            "unix_socket_dir": "",
            "auth_type": "any",
            # With auth_type = any every client reaches the console (as user
            # pgbouncer); named all the same, for a stricter auth_type.
            "admin_users": self.backend["user"],
            "pool_mode": self.pool_mode,
            "max_client_conn": "200",
            "default_pool_size": "20",
            # Transaction mode hands a server connection back at each commit; a
            # reset query runs only when a session ends.
            "server_reset_query": "",
            # Each transaction gets the next server connection in turn, not
            # the one used last: a quiet pool would otherwise hand one client
            # the same session again and again, and hide a statement that
            # leans on what an earlier one left in its session.
            "server_round_robin": "1",
            # libpq-based clients may send these; PgBouncer refuses unknown
            # startup parameters unless told to ignore them.
            "ignore_startup_parameters": "extra_float_digits,options",
            "logfile": str(self.logfile),
            "pidfile": str(self.pidfile),
        }
        if self.run_as is not None:
            settings["user"] = self.run_as.pw_name
        lines = ["[databases]", f"* = {backend}", "", "[pgbouncer]"]
        lines += [f"{key} = {value}" for key, value in settings.items()]
        self.config.write_text("\n".join(lines) + "\n")
        if self.run_as is not None:
            os.chown(self.config, self.run_as.pw_uid, self.run_as.pw_gid)

    def _start(self) -> None:
        for attempt in range(1, START_TRIES + 1):
            self.port = free_port()
            self._write_config()
            with self.output.open("ab") as out:
                self.proc = subprocess.Popen([BINARY, str(self.config)], stdout=out, stderr=subprocess.STDOUT)
            try:
                self._wait_ready()
                return
            except PgBouncerError:
                taken = "Address already in use" in self.log_tail()
                self._terminate()
                if not taken or attempt == START_TRIES:
                    raise

    def _wait_ready(self) -> None:
        """Until a SELECT 1 through it reaches the server."""
        assert self.proc is not None
        deadline = time.monotonic() + START_TIMEOUT
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PgBouncerError(f"pgbouncer exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                conn = psycopg2.connect(self.url(self.backend["dbname"]), connect_timeout=2)
                try:
                    with conn.cursor() as cur:
                        cur.execute("SELECT 1")
                    return
                finally:
                    conn.close()
            except psycopg2.Error as exc:
                last = exc
                time.sleep(0.1)
        raise PgBouncerError(f"pgbouncer did not answer within {START_TIMEOUT:g}s ({last}):\n{self.log_tail()}")

    def _terminate(self) -> None:
        """SIGTERM (PgBouncer's fast exit), then SIGKILL if it lingers."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        """Stop the process and remove its folder; safe to call twice."""
        self._terminate()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PgBouncer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
