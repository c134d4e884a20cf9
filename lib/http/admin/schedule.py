"""The schedule page: each clock entry (lib/background/clock.py's
Scheduled, as the worker hands them over: this layer imports none of the
clock) with its cadence, its next runs and the last minute a clock fired it.

A cron entry's runs come from cronsim (lib/background/cron.py's Cron keeps
its string and zone); any other cadence is a plain predicate, asked minute by
minute, at most a day ahead, and once a minute whatever the page views. A
cadence made by lib/background/clock.py's makers (every, hourly, daily,
weekdays) is written as the call that made it, read from the predicate's
closure; another predicate by its function's name.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, cast

from lib.store.sql import Q

RUNS = 3
# How far a predicate other than cron's is asked ahead.
SCAN = timedelta(days=1)
MINUTE = timedelta(minutes=1)


class CronRuns(Protocol):
    """A cron cadence (lib/background/cron.py's Cron): its string, its zone and its runs."""

    expr: str
    tz: str

    def runs(self, after: datetime) -> Iterator[datetime]: ...


def _cron(at: object) -> CronRuns | None:
    return cast(CronRuns, at) if all(hasattr(at, a) for a in ("expr", "tz", "runs")) else None


@dataclass(frozen=True)
class Entry:
    queue: str
    name: str
    args: str  # JSON text
    cadence: str
    next_runs: list[datetime]
    last_fired: datetime | None
    catch_up: bool


class Schedule:
    """The schedule's entries as the page shows them; the runs ahead are
    worked out once a minute."""

    def __init__(self, entries: Sequence[Any]) -> None:
        self.entries = list(entries)
        self._runs: tuple[datetime, list[list[datetime]]] | None = None

    def shown(self, db: Any, now: datetime) -> list[Entry]:
        minute = now.astimezone(UTC).replace(second=0, microsecond=0)
        if self._runs is None or self._runs[0] != minute:
            self._runs = (minute, [next_runs(e.at, minute) for e in self.entries])
        runs = self._runs[1]
        params = {"names": [e.name for e in self.entries], "entries": [e.key for e in self.entries]}
        fired = {(n, k): m for n, k, m in db.query(Q.admin_clock_last_fired, params)} if self.entries else {}
        return [
            Entry(
                queue=e.queue,
                name=e.name,
                args=json.dumps(e.args or {}, ensure_ascii=False, sort_keys=True),
                cadence=cadence(e.at),
                next_runs=runs[i],
                last_fired=fired.get((e.name, e.key)),
                catch_up=e.catch_up,
            )
            for i, e in enumerate(self.entries)
        ]


def next_runs(at: Callable[[datetime], bool], minute: datetime, count: int = RUNS) -> list[datetime]:
    """The next `count` minutes after `minute` that `at` fires at; for a
    predicate other than cron's, only those within SCAN."""
    cron = _cron(at)
    if cron is not None:
        runs = cron.runs(minute)
        return [next(runs) for _ in range(count)]
    found: list[datetime] = []
    t = minute + MINUTE
    while t <= minute + SCAN and len(found) < count:
        if at(t):
            found.append(t)
        t += MINUTE
    return found


def cadence(at: Callable[..., Any]) -> str:
    """A cadence as the schedule wrote it: the makers' cadences and cron's say
    so themselves (every(15), cron('0 9 * * 1-5', tz='Europe/Paris')); any
    other predicate is shown by its function's name."""
    if not hasattr(at, "__qualname__"):
        return str(at)
    return at.__qualname__.replace(".<locals>", "")
