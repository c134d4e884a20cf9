"""A worker process refuses to fork.

A handler's fork clones the whole worker, not the handler: the child's hub
still holds every poller, the lease keeper and the listener, with the
parent's worker id and the parent's open database sockets. The child claims
and runs jobs of any queue, two processes speak on one server session, and the
child outlives the worker. What the child should run is the handler's business,
and a clone cannot be made to run only that, so the worker refuses the fork
with ForkRefused and its message says what to use instead.

What still works: subprocess (gevent's, as monkey-patched, forks with the
original os.fork it keeps for itself and execs in the child before the hub
can run), os.posix_spawn, and a Process of multiprocessing's "spawn" or
"forkserver" context (a fresh interpreter, started through _posixsubprocess;
its queues and pipes work, its exit code may not: gevent's child watcher,
once gevent.subprocess has run, reaps every child). What is refused: os.fork
and os.forkpty, so pty.fork, the os.spawn* functions (they fork in Python)
and multiprocessing's "fork" context (the default on Linux), and gevent's
own forks.

Installed by worker.run, not at import: a test, or a program that only
inserts jobs, keeps its fork. It holds for the rest of the process: a worker
process ends when run returns.
"""

from __future__ import annotations

import os
import posix
from collections.abc import Callable
from types import ModuleType
from typing import NoReturn

import gevent
import gevent.os

# Every name that clones the interpreter with its hub. gevent.os's are
# replaced too: monkey-patching copies os.fork and os.forkpty from there, so a
# handler that patches again gets the refusal back, not gevent's fork.
_FORKS: tuple[tuple[ModuleType, str], ...] = (
    (os, "fork"),
    (os, "forkpty"),
    (posix, "fork"),
    (posix, "forkpty"),
    (gevent, "fork"),
    (gevent.os, "fork"),
    (gevent.os, "forkpty"),
    (gevent.os, "fork_gevent"),
    (gevent.os, "forkpty_gevent"),
    (gevent.os, "fork_and_watch"),
    (gevent.os, "forkpty_and_watch"),
)

INSTEAD = (
    "start a program with subprocess, and Python code with a Process of multiprocessing.get_context('spawn')"
    " (or 'forkserver'); multiprocessing's 'fork' start method, its default on Linux, forks too"
)


class ForkRefused(RuntimeError):
    """A fork in a worker process. A job whose handler raises it ends
    `err: ForkRefused: <what to use instead>`."""


def refuse_fork() -> None:
    """From now on, every fork of this process raises ForkRefused instead."""
    for module, name in _FORKS:
        if hasattr(module, name):
            setattr(module, name, _refusal(f"{module.__name__}.{name}"))


def _refusal(name: str) -> Callable[..., NoReturn]:
    def refused(*_args: object, **_kwargs: object) -> NoReturn:
        raise ForkRefused(
            f"{name}() is refused in a worker process: the child would be a copy of the whole worker"
            f" (its pollers, lease keeper and database connections) and run jobs of its own; {INSTEAD}"
        )

    refused.__name__ = refused.__qualname__ = name.rsplit(".", 1)[1]
    refused.__doc__ = f"Refused in a worker process (lib/store/forks.py): raises ForkRefused instead of {name}()."
    return refused
