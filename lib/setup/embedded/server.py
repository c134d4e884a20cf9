"""The server process: initdb, postgres started without a shell and waited
for until it is ready, stopped fast and then at once."""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("jobs.embedded")

# With no TCP listener the port only names the socket file; pinned so that a
# PGPORT in the environment cannot send a client to another name.
PORT = 5432
SOCKET_NAME = f".s.PGSQL.{PORT}"
START_TIMEOUT = 60.0
STOP_TIMEOUT = 60.0
# Servers this process launched, so it can reap the ones it stops.
_children: dict[Path, subprocess.Popen[bytes]] = {}


@dataclass
class _Pidfile:
    pid: int
    socket_dir: str
    listen: str
    status: str


def pidfile(pgdata: Path) -> _Pidfile | None:
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


def is_running(pgdata: Path, socket_dir: Path) -> bool:
    """A server runs in pgdata as we would start it. One that does not (an
    earlier release's, its socket elsewhere) is stopped here."""
    info = pidfile(pgdata)
    if info is None or not _answers(info.socket_dir):
        return False
    if info.socket_dir == str(socket_dir) and info.listen == "":
        return True
    log.warning("restarting the server in %s: it listens on %r, socket in %s", pgdata, info.listen, info.socket_dir)
    stop_cluster(pgdata)
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


def initdb(bindir: Path, pgdata: Path, user: pwd.struct_passwd | None) -> None:
    """A new cluster, made beside pgdata and renamed into place, so that an
    initdb killed part-way never leaves a half-made one to start."""
    making = pgdata.with_name(pgdata.name + ".new")
    shutil.rmtree(making, ignore_errors=True)
    # Trust for local connections: the socket folder decides who connects.
    # host=reject: were TCP ever turned on, it would still admit no one.
    auth = ["--auth-local=trust", "--auth-host=reject"]
    _run([str(bindir / "initdb"), "-D", str(making), "-U", "postgres", *auth, "-E", "UTF8"], pgdata.parent, user)
    making.rename(pgdata)


def launch(bindir: Path, pgdata: Path, socket_dir: Path, log_path: Path, user: pwd.struct_passwd | None) -> None:
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
        info = pidfile(pgdata)
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


def stop_cluster(pgdata: Path) -> None:
    """Fast shutdown (sessions cut, nothing lost), waiting as pg_ctl does for
    postmaster.pid to go; an immediate one if that takes too long."""
    info = pidfile(pgdata)
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
