"""Who runs the server and who can reach it: as root, the server's user and
the folder of its cluster; the socket's private folder."""

from __future__ import annotations

import grp
import hashlib
import logging
import os
import pwd
import stat
import tempfile
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

from lib.setup.embedded.server import SOCKET_NAME

log = logging.getLogger("jobs.embedded")

# Postgres refuses to run as root; as root the server runs as the first of
# these the machine has.
SERVER_USERS = ("postgres", "nobody")
# As root, where the cluster lives when the server's user cannot reach the
# data folder: a folder per data folder, which only root may create here.
OUTSIDE_PARENT = Path("/var/lib")
# sun_path holds 108 bytes, the last one a NUL.
MAX_SOCKET_PATH = 107


@dataclass
class Server:
    """Who runs the server and where its files live."""

    # None: this process's own user.
    user: pwd.struct_passwd | None
    # The folder of the cluster and its socket folder: the data folder, or
    # one made for the server outside it.
    home: Path
    # What start set up to run it as root, for the log line.
    setup: list[str] = field(default_factory=list)


def server_user() -> pwd.struct_passwd | None:
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


def for_data_dir(data_dir: Path) -> Server:
    """Who runs the server for data_dir and where its cluster lives, those
    folders made and handed to that user."""
    user = server_user()
    if user is None:
        own(data_dir, None)
        return Server(None, data_dir)
    server = Server(user, data_dir, [f"as root it runs as {user.pw_name!r}"])
    closed = closed_above(data_dir, user)
    if closed is None:
        own(data_dir, user)
        return server
    # The data folder stays root's: the server's user needs none of it.
    own(data_dir, root_user())
    server.home = outside_home(data_dir)
    shut = closed_above(server.home, user)
    if shut is not None:
        raise RuntimeError(
            f"as root the embedded server runs as {user.pw_name!r}, which can enter neither {closed} "
            f"nor {shut}: put the data folder (JOBS_DATA_DIR) where it can, run the worker as another user, "
            "or set DATABASE_URL"
        )
    own(server.home, user)
    server.setup.append(f"{closed} is closed to it, so its cluster is in {server.home} (0700, {user.pw_name}'s)")
    return server


def root_user() -> pwd.struct_passwd:
    return pwd.getpwuid(os.geteuid())


def outside_home(data_dir: Path) -> Path:
    """The server's folder for data_dir when data_dir is out of its reach:
    one name per data folder, so every start finds the same cluster."""
    digest = hashlib.sha256(os.fsencode(data_dir)).hexdigest()[:16]
    return OUTSIDE_PARENT / f"jobs-pg-{digest}"


def closed_above(path: Path, user: pwd.struct_passwd) -> Path | None:
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


def own(folder: Path, user: pwd.struct_passwd | None) -> None:
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


def own_tree(pgdata: Path, user: pwd.struct_passwd) -> None:
    """A cluster made for another server user (an earlier release's, or
    before a postgres user existed) becomes this one's; it is ours."""
    if not pgdata.exists() or pgdata.lstat().st_uid == user.pw_uid:
        return
    log.info("handing %s to the %s user", pgdata, user.pw_name)
    for folder, dirs, files in os.walk(pgdata):
        for name in [folder, *(os.path.join(folder, n) for n in dirs + files)]:
            os.lchown(name, user.pw_uid, user.pw_gid)


def is_private(folder: Path, user: pwd.struct_passwd | None) -> bool:
    try:
        st = folder.lstat()
    except FileNotFoundError:
        return False
    owner = user.pw_uid if user is not None else os.geteuid()
    return stat.S_ISDIR(st.st_mode) and st.st_uid == owner and stat.S_IMODE(st.st_mode) == 0o700


def fits(socket_dir: Path) -> bool:
    return len(os.fsencode(socket_dir / SOCKET_NAME)) <= MAX_SOCKET_PATH


def make_socket_dir(data_dir: Path, server: Server, source: str) -> Path:
    """A folder for the socket that only the server's user may enter: beside
    the cluster, else (path too long) a short one made by mkdtemp, recorded
    in the data folder so that every start finds the same."""
    user = server.user
    inside = server.home / f"{source}-socket"
    if fits(inside):
        own(inside, user)
        return inside
    record = data_dir / f"{source}-socket.path"
    with suppress(FileNotFoundError):
        recorded = Path(record.read_text().strip())
        # Anyone may create a folder of that name in /tmp once ours is gone.
        if is_private(recorded, user) and fits(recorded):
            return recorded
    made = Path(tempfile.mkdtemp(prefix="jobs-pg-"))
    if not fits(made):
        made.rmdir()
        raise RuntimeError(f"the temporary folder {made.parent} is too long a path for a Unix socket; set TMPDIR")
    if user is not None:
        os.chown(made, user.pw_uid, user.pw_gid)
    record.write_text(f"{made}\n")
    return made


def socket_owner(folder: Path) -> pwd.struct_passwd | None:
    """Whose a recorded socket folder must be to be ours: the server's user."""
    try:
        return server_user()
    except RuntimeError:
        return None
