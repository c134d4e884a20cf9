"""What the worker refuses to start with, checked once, before anything
connects or starts: a queue constructor that raises (a handler's name with a
stray space, say), a schedule that cannot be loaded (a bad cadence such as
every(7), an entry's name with a stray space) and a schedule entry listed
twice. `worker.main` calls checked() for every command, and defined() for
`check` and the worker (the worker on its own pool), so check fails on
exactly what would stop the worker, and the worker stops with one line and
exit code 2, not with a traceback from a part half started.
"""

from __future__ import annotations

import importlib
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lib.background.clock import Scheduled, check_schedule
from lib.job.rate import check_shared
from lib.setup.parsers import SettingError
from lib.store.db import DB

# The library's own frames: a fault is placed at the line of the caller's code below them.
_LIB = Path(__file__).resolve().parents[1]

Schedule = Sequence[Scheduled] | Callable[[], Sequence[Scheduled]]


def checked(schedule: Schedule) -> list[Scheduled]:
    """The schedule (loaded, when given as a loader), once it can run; else
    SettingError, one line."""
    entries = _loaded(schedule)
    try:
        check_schedule(entries)
    except ValueError as exc:
        raise SettingError(str(exc)) from None
    return entries


def defined(registry: Sequence[Callable[[DB], Any]], db: DB) -> list[Any]:
    """Each constructor's queue definition (lib/run/queue.py), on db, which a
    constructor may keep for its handlers; SettingError, one line, naming the
    first constructor that raises."""
    made = []
    for make in registry:
        try:
            made.append(make(db))
        except Exception as exc:
            raise SettingError(f"{_label(make)} cannot build its queue: {_fault(exc)}") from None
    try:
        check_shared((q.name, q.rate, q.budgets) for q in made if q.rate is not None or q.budgets)
    except ValueError as exc:
        raise SettingError(str(exc)) from None
    return made


def unconnected() -> DB:
    """A pool that never connects, for `check`: the constructors only keep
    the pool they are given, and check reads the code, not the database."""
    return DB("postgresql:///unused", size=1)


def loader(module: str, name: str = "SCHEDULE") -> Callable[[], list[Scheduled]]:
    """The schedule of a module, imported when checked() asks for it: a bad
    entry raises as the module is imported, and checked() says where."""

    def load() -> list[Scheduled]:
        return list(getattr(importlib.import_module(module), name))

    return load


def _loaded(schedule: Schedule) -> list[Scheduled]:
    if not callable(schedule):
        return list(schedule)
    try:
        return list(schedule())
    except Exception as exc:
        raise SettingError(f"schedule{_where(exc)}: {_fault(exc)}") from None


def _label(make: Callable[..., Any]) -> str:
    return f"{getattr(make, '__module__', '?')}.{getattr(make, '__qualname__', repr(make))}"


def _fault(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text:.300}"


def _where(exc: BaseException) -> str:
    """ " (file:line)" of the last frame in the caller's code (the schedule's
    module, as it was imported), or "" when there is none."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = Path(frame.filename)
        if path.is_file() and not path.resolve().is_relative_to(_LIB):
            return f" ({_shown(path)}:{frame.lineno})"
    return ""


def _shown(path: Path) -> str:
    path = path.resolve()
    root = _LIB.parent
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)
