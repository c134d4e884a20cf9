"""A worker process with a "forks" queue, whose handlers fork or start
processes, and a "noop" queue, whose handler appends "<pid> <job id>" to
$RUNS_FILE, so a test sees which process ran each job.

Jobs of "forks": fork.Fork {"how": one of FORKS}: forks that way; a child, if
there is one, writes $MARKERS/<how>-<pid>, waits cooperatively (its hub runs
meanwhile, as a child's that does any I/O would) and exits. fork.Subprocess {}:
runs a Python child with subprocess. fork.Spawn {}: runs a Python child with
multiprocessing's "spawn" context. Each of the two ends "ok: child <its pid>".
Jobs of "noop": noop.Run {}.
"""

from gevent import monkey

monkey.patch_all()

import multiprocessing  # noqa: E402
import os  # noqa: E402
import posix  # noqa: E402
import pty  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import gevent  # noqa: E402

import worker  # noqa: E402
from lib.job import PendingJob, status  # noqa: E402
from lib.job.args import unmarshal_args  # noqa: E402
from lib.run.queue import Queue  # noqa: E402
from lib.store.db import DB  # noqa: E402

# How long a child, if one is made, lives on as a clone of the worker.
CHILD_SECONDS = 5.0


@dataclass
class How:
    how: str


def _in_child(how: str) -> None:
    Path(os.environ["MARKERS"], f"{how}-{os.getpid()}").touch()
    gevent.sleep(CHILD_SECONDS)
    os._exit(0)


def _multiprocessing_fork() -> int:
    child = multiprocessing.get_context("fork").Process(target=_in_child, args=("multiprocessing.fork",))
    child.start()
    return child.pid or 0


def _pty_fork(fork: Callable[[], tuple[int, int]]) -> Callable[[], int]:
    def forked() -> int:
        pid, master_fd = fork()
        if pid:
            os.close(master_fd)
        return pid

    return forked


# Each returns the child's pid in the parent and 0 in the child.
FORKS: dict[str, Callable[[], int]] = {
    "os.fork": lambda: os.fork(),
    "os.forkpty": _pty_fork(lambda: os.forkpty()),
    "pty.fork": _pty_fork(lambda: pty.fork()),
    "posix.fork": lambda: posix.fork(),
    "gevent.fork": lambda: gevent.fork(),
    "multiprocessing.fork": _multiprocessing_fork,
}


def fork(job: PendingJob) -> str:
    how = unmarshal_args(How, job.args).how
    pid = FORKS[how]()
    if pid == 0:
        _in_child(how)
    return status.ok(f"forked {pid}")


def run_subprocess(job: PendingJob) -> str:
    code = "import os; print(os.getpid())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    return status.ok(f"child {done.stdout.strip()}")


def _send_pid(pids: "multiprocessing.Queue[int]") -> None:
    pids.put(os.getpid())


def spawn(job: PendingJob) -> str:
    context = multiprocessing.get_context("spawn")
    pids: multiprocessing.Queue[int] = context.Queue()
    child = context.Process(target=_send_pid, args=(pids,))
    child.start()
    pid = pids.get(timeout=60)
    # Waits on the child's sentinel, cooperatively. Its exit code is not
    # read: gevent's child watcher, once gevent.subprocess has run, reaps
    # every child, so multiprocessing finds none to wait for.
    child.join(timeout=60)
    pids.close()
    return status.ok(f"child {pid}")


def noop(job: PendingJob) -> str:
    with open(os.environ["RUNS_FILE"], "a") as out:
        out.write(f"{os.getpid()} {job.id}\n")
    return status.ok()


def make_forks(db: DB) -> Queue:
    handlers = {"fork.Fork": fork, "fork.Subprocess": run_subprocess, "fork.Spawn": spawn}
    return Queue("forks", handlers, poll_interval=0.5)


def make_noop(db: DB) -> Queue:
    return Queue("noop", {"noop.Run": noop}, poll_interval=0.5, concurrency=4)


if __name__ == "__main__":
    sys.exit(worker.main([make_forks, make_noop]))
