"""A private Postgres for when no DATABASE_URL is given.

Binaries: those the pgserver package bundles where it has a wheel (CPython
3.9-3.12: nothing to install but Python), else a PostgreSQL installed on the
machine. Either way this module starts them itself. pgserver's own start code
is not used: as root it creates a system user and opens every folder above
the data to all users, and on a long path it puts the socket in a folder
anyone may enter, while the server trusts whoever reaches its socket.

Who can reach it: the server listens on no TCP port and trusts its Unix
socket, so the socket's folder is the lock: mode 0700, owned by the user the
server runs as. It is a folder inside the data folder (itself 0700) or, when
that path is too long for a socket, a private folder made by mkdtemp and
recorded in the data folder.

Root: Postgres refuses to run as root, so a worker run by root hands the server
to the machine's existing `postgres` user. The data folder and the socket
folder become that user's (0700); nothing outside the data folder changes and
no user is created, so postgres must already be able to enter the folders
above the data folder.

Lifetime: each process that starts the server holds a shared lock on the
data folder's `users` file while it runs, and the last one to exit stops the
server. Starts and stops take turns on the data folder's `lock` file, so
processes that start at once share one server.
"""

from __future__ import annotations

import atexit
import fcntl
import glob
import grp
import importlib.util
import logging
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

from lib.settings import EMBEDDED_SOURCES
from lib.sql import ROOT

if TYPE_CHECKING:
    from lib.settings import Settings

log = logging.getLogger("jobs.embedded")

DEFAULT_DIR = ROOT / ".pgdata"
# Folders where distributions put PostgreSQL's server binaries when they are
# not on PATH (Debian and Ubuntu, the PGDG RPMs, a build from source).
SYSTEM_BIN_GLOBS = ("/usr/lib/postgresql/*/bin", "/usr/pgsql-*/bin", "/usr/local/pgsql/bin")
# Where the binaries come from (JOBS_EMBEDDED), each with a cluster of its own in the data folder.
SOURCES = EMBEDDED_SOURCES
# Postgres refuses to run as root; as root the server runs as this user.
SERVER_USER = "postgres"
# With no TCP listener the port only names the socket file; pinned so that a
# PGPORT in the environment cannot send a client to another name.
PORT = 5432
SOCKET_NAME = f".s.PGSQL.{PORT}"
# sun_path holds 108 bytes, the last one a NUL.
MAX_SOCKET_PATH = 107
START_TIMEOUT = 60.0
STOP_TIMEOUT = 60.0

NOTHING_TO_RUN = (
    "no PostgreSQL for the embedded server: pgserver is not installed (requirements.txt installs it on "
    "Python 3.11 and 3.12 only) and no initdb was found on PATH or in {globs}. Install PostgreSQL's server "
    "(Debian/Ubuntu: apt-get install postgresql; Fedora: dnf install postgresql-server; macOS: brew install "
    "postgresql), or set DATABASE_URL to a server of your own."
)

# Per data folder: the fd of this process's shared lock on its users file.
_holds: dict[Path, int] = {}
# Servers this process launched, so it can reap the ones it stops.
_children: dict[Path, subprocess.Popen[bytes]] = {}


def database_url(settings: Settings, data_dir: Path | None = None) -> str:
    """The settings' DATABASE_URL when set; else the URL of the embedded
    server in data_dir (by default the settings' JOBS_DATA_DIR, else
    DEFAULT_DIR), started if it is not running, on the binaries
    JOBS_EMBEDDED names."""
    if settings.database_url:
        return settings.database_url
    return start(data_dir or settings.data_dir or DEFAULT_DIR, settings.embedded)


def start(data_dir: Path, source: str | None = None) -> str:
    """The URL of the server in data_dir (its cluster is data_dir/<source>),
    started unless it runs already, on the binaries of source (binaries()).
    This process keeps it running until it exits or calls stop()."""
    data_dir = data_dir.resolve()
    source, bindir = binaries(source)
    user = _server_user()
    if user is not None:
        _check_reachable(data_dir, user)
    _own(data_dir, user)
    with _locked(data_dir):
        pgdata = data_dir / source
        socket_dir = _socket_dir(data_dir, source, user)
        running = _running(pgdata, socket_dir)
        if not running:
            if user is not None:
                _own_tree(pgdata, user)
            if not (pgdata / "PG_VERSION").exists():
                _initdb(bindir, pgdata, user)
            _launch(bindir, pgdata, socket_dir, data_dir / f"{source}.log", user)
        _hold(data_dir)
    how = "running" if running else "started"
    log.info("embedded Postgres %s in %s (binaries: %s; socket in %s)", how, pgdata, bindir, socket_dir)
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


def binaries(wanted: str | None = None) -> tuple[str, Path]:
    """(source, folder of initdb and postgres): pgserver's unless wanted is
    "system" (JOBS_EMBEDDED) or pgserver is not installed, else the machine's."""
    if wanted not in (None, *SOURCES):
        raise RuntimeError(f"JOBS_EMBEDDED={wanted!r}: use one of {', '.join(SOURCES)}, or leave it unset")
    if wanted != "system":
        bundled = bundled_bindir()
        if bundled is not None:
            return "pgserver", bundled
        if wanted == "pgserver":
            raise RuntimeError("JOBS_EMBEDDED=pgserver, but pgserver is not installed")
    found = system_bindir()
    if found is None:
        raise RuntimeError(NOTHING_TO_RUN.format(globs=", ".join(SYSTEM_BIN_GLOBS)))
    return "system", found


def bundled_bindir() -> Path | None:
    """pgserver's binaries, found without importing it: its import creates
    folders and locks of its own and warns where XDG_RUNTIME_DIR is unset."""
    spec = importlib.util.find_spec("pgserver")
    if spec is None or spec.origin is None:
        return None
    bindir = Path(spec.origin).parent / "pginstall" / "bin"
    return bindir if (bindir / "postgres").exists() else None


def system_bindir() -> Path | None:
    """initdb's folder on PATH (symlinks resolved, as Homebrew's and
    /usr/local/bin's are), else the newest in the distributions' folders."""
    candidates: list[Path] = []
    found = shutil.which("initdb")
    if found:
        candidates.append(Path(found).resolve().parent)
    folders = [Path(p) for pattern in SYSTEM_BIN_GLOBS for p in glob.glob(pattern)]
    candidates += sorted(folders, key=lambda p: [int(n) for n in re.findall(r"\d+", str(p))], reverse=True)
    return next((c for c in candidates if (c / "initdb").exists() and (c / "postgres").exists()), None)


def _server_user() -> pwd.struct_passwd | None:
    """The user the server runs as when it cannot be this process's: None
    unless we are root."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SERVER_USER)
    except KeyError:
        raise RuntimeError(
            f"Postgres refuses to run as root, and as root the embedded server runs as the {SERVER_USER!r} user, "
            f"which this machine does not have: run the worker as another user, create a {SERVER_USER!r} user "
            "(installing PostgreSQL does), or set DATABASE_URL"
        ) from None


def _check_reachable(data_dir: Path, user: pwd.struct_passwd) -> None:
    """As root: the server's user must be able to enter every folder above the
    data folder. Opening them up is not ours to do, so say which one is shut."""
    groups = {user.pw_gid} | {g.gr_gid for g in grp.getgrall() if user.pw_name in g.gr_mem}
    for folder in reversed(data_dir.parents):
        try:
            st = folder.stat()
        except FileNotFoundError:
            return  # we create the rest, with modes it can enter
        if st.st_uid == user.pw_uid:
            allowed = st.st_mode & stat.S_IXUSR
        elif st.st_gid in groups:
            allowed = st.st_mode & stat.S_IXGRP
        else:
            allowed = st.st_mode & stat.S_IXOTH
        if not allowed:
            raise RuntimeError(
                f"as root the embedded server runs as {user.pw_name!r}, which cannot enter {folder} "
                f"(mode {stat.S_IMODE(st.st_mode):o}): put the data folder (JOBS_DATA_DIR) where it can, "
                "run the worker as another user, or set DATABASE_URL"
            )


def _own(folder: Path, user: pwd.struct_passwd | None) -> None:
    """folder exists, is mode 0700 and belongs to the server's user."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = folder.lstat()
    if user is not None:
        if (st.st_uid, st.st_gid) != (user.pw_uid, user.pw_gid):
            os.chown(folder, user.pw_uid, user.pw_gid)
    elif st.st_uid != os.geteuid():
        raise RuntimeError(f"{folder} belongs to another user; the embedded server needs a data folder of its own")
    if stat.S_IMODE(st.st_mode) != 0o700:
        folder.chmod(0o700)


def _own_tree(pgdata: Path, user: pwd.struct_passwd) -> None:
    """A cluster made by an earlier release (pgserver ran it as its own user)
    becomes the server user's; it is inside our data folder."""
    if not pgdata.exists() or pgdata.lstat().st_uid == user.pw_uid:
        return
    log.info("handing %s to the %s user", pgdata, user.pw_name)
    for folder, dirs, files in os.walk(pgdata):
        for name in [folder, *(os.path.join(folder, n) for n in dirs + files)]:
            os.lchown(name, user.pw_uid, user.pw_gid)


def _is_private(folder: Path, user: pwd.struct_passwd | None) -> bool:
    try:
        st = folder.lstat()
    except FileNotFoundError:
        return False
    owner = user.pw_uid if user is not None else os.geteuid()
    return stat.S_ISDIR(st.st_mode) and st.st_uid == owner and stat.S_IMODE(st.st_mode) == 0o700


def _fits(socket_dir: Path) -> bool:
    return len(os.fsencode(socket_dir / SOCKET_NAME)) <= MAX_SOCKET_PATH


def _socket_dir(data_dir: Path, source: str, user: pwd.struct_passwd | None) -> Path:
    """A folder for the socket that only the server's user may enter: in the
    data folder, else (path too long) a short one made by mkdtemp, recorded
    in the data folder so that every start finds the same."""
    inside = data_dir / f"{source}-socket"
    if _fits(inside):
        _own(inside, user)
        return inside
    record = data_dir / f"{source}-socket.path"
    with suppress(FileNotFoundError):
        recorded = Path(record.read_text().strip())
        # Anyone may create a folder of that name in /tmp once ours is gone.
        if _is_private(recorded, user) and _fits(recorded):
            return recorded
    made = Path(tempfile.mkdtemp(prefix="jobs-pg-"))
    if not _fits(made):
        made.rmdir()
        raise RuntimeError(f"the temporary folder {made.parent} is too long a path for a Unix socket; set TMPDIR")
    if user is not None:
        os.chown(made, user.pw_uid, user.pw_gid)
    record.write_text(f"{made}\n")
    return made


@dataclass
class _Pidfile:
    pid: int
    socket_dir: str
    listen: str
    status: str


def _pidfile(pgdata: Path) -> _Pidfile | None:
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
    except FileNotFoundError:
        return None
    if len(lines) < 8:
        return None  # still being written
    return _Pidfile(int(lines[0]), lines[4].strip(), lines[5].strip(), lines[7].strip())


def _answers(socket_dir: str) -> bool:
    """A server accepts connections on the socket (a crash leaves the file)."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(5)
        try:
            sock.connect(os.path.join(socket_dir, SOCKET_NAME))
        except OSError:
            return False
    return True


def _running(pgdata: Path, socket_dir: Path) -> bool:
    """A server runs in pgdata as we would start it. One that does not (an
    earlier release's, its socket elsewhere) is stopped here."""
    info = _pidfile(pgdata)
    if info is None or not _answers(info.socket_dir):
        return False
    if info.socket_dir == str(socket_dir) and info.listen == "":
        return True
    log.warning("restarting the server in %s: it listens on %r, socket in %s", pgdata, info.listen, info.socket_dir)
    _stop(pgdata)
    return False


def _as(user: pwd.struct_passwd | None) -> dict:
    """subprocess arguments that run a command as the server's user."""
    if user is None:
        return {}
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


def _run(argv: list[str], cwd: Path, user: pwd.struct_passwd | None) -> None:
    try:
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, **_as(user))
    except OSError as exc:
        raise RuntimeError(f"could not run {argv[0]}{_as_whom(user)}: {exc}") from exc
    if done.returncode != 0:
        output = (done.stderr + done.stdout).strip()
        raise RuntimeError(f"{Path(argv[0]).name} failed (exit {done.returncode}){_as_whom(user)}:\n{output}")


def _as_whom(user: pwd.struct_passwd | None) -> str:
    return f" as {user.pw_name}" if user is not None else ""


def _initdb(bindir: Path, pgdata: Path, user: pwd.struct_passwd | None) -> None:
    """A new cluster, made beside pgdata and renamed into place, so that an
    initdb killed part-way never leaves a half-made one to start."""
    making = pgdata.with_name(pgdata.name + ".new")
    shutil.rmtree(making, ignore_errors=True)
    # Trust for local connections: the socket folder decides who connects.
    # host=reject: were TCP ever turned on, it would still admit no one.
    auth = ["--auth-local=trust", "--auth-host=reject"]
    _run([str(bindir / "initdb"), "-D", str(making), "-U", "postgres", *auth, "-E", "UTF8"], pgdata.parent, user)
    making.rename(pgdata)


def _launch(bindir: Path, pgdata: Path, socket_dir: Path, log_path: Path, user: pwd.struct_passwd | None) -> None:
    """postgres itself, with its settings as separate arguments: no pg_ctl,
    whose start goes through a shell. Returns once it accepts connections."""
    # unix_socket_directories is a list; quoted, a path may hold anything.
    socket_setting = '"' + str(socket_dir).replace('"', '""') + '"'
    argv = [str(bindir / "postgres"), "-D", str(pgdata)]
    argv += ["-c", "listen_addresses=", "-c", f"unix_socket_directories={socket_setting}", "-c", f"port={PORT}"]
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    began = os.lseek(fd, 0, os.SEEK_END)
    try:
        # Its own session: a Ctrl-C meant for the worker does not reach it.
        proc = subprocess.Popen(
            argv,
            cwd=pgdata,
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **_as(user),
        )
    except OSError as exc:
        raise RuntimeError(f"could not run {argv[0]}{_as_whom(user)}: {exc}") from exc
    finally:
        os.close(fd)
    _children[pgdata] = proc
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        info = _pidfile(pgdata)
        if info is not None and info.pid == proc.pid and info.status == "ready":
            return
        if proc.poll() is not None:
            raise RuntimeError(f"the embedded server did not start (exit {proc.returncode}):\n{_tail(log_path, began)}")
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"the embedded server did not start in {START_TIMEOUT:.0f} s:\n{_tail(log_path, began)}")
        time.sleep(0.05)


def _tail(log_path: Path, offset: int, lines: int = 30) -> str:
    """The log written since offset, its last lines: the server's own words."""
    with log_path.open("rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    return "\n".join(text.strip().splitlines()[-lines:]) + f"\n(log: {log_path})"


def _stop(pgdata: Path) -> None:
    """Fast shutdown (sessions cut, nothing lost), waiting as pg_ctl does for
    postmaster.pid to go; an immediate one if that takes too long."""
    info = _pidfile(pgdata)
    if info is not None:
        for sig in (signal.SIGINT, signal.SIGQUIT):
            try:
                os.kill(info.pid, sig)
            except ProcessLookupError:
                break  # a crash left the file; the next start replaces it
            deadline = time.monotonic() + STOP_TIMEOUT
            while (pgdata / "postmaster.pid").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            if not (pgdata / "postmaster.pid").exists():
                break
        else:
            raise RuntimeError(f"the embedded server in {pgdata} (pid {info.pid}) did not stop")
    child = _children.pop(pgdata, None)
    if child is not None:
        child.wait()


def _stop_all(data_dir: Path) -> None:
    for source in SOURCES:
        _stop(data_dir / source)
        # Nothing is left in /tmp; the next start makes a new one.
        record = data_dir / f"{source}-socket.path"
        with suppress(FileNotFoundError):
            recorded = Path(record.read_text().strip())
            if _is_private(recorded, _server_user()):
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
