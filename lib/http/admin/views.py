"""The read-only pages' values: the queues, one queue, the schedule and the
workers, and the numbers each page refreshes by itself (/admin/live, polled
by the page's script). A page and its refresh share one function per page,
so a number is written the same way in both."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from lib.http.admin import timeline
from lib.http.admin.queues import RATE_MINUTES, QueueRow, rows
from lib.http.admin.render import ago, count
from lib.http.admin.schedule import Entry, Schedule
from lib.operate import overview
from lib.operate.overview import WorkerInfo
from lib.store.sql import Q

# The pages that refresh their numbers, by the name /admin/live?page= takes.
LIVE_PAGES = ("queues", "queue", "workers", "schedule")


@dataclass
class Site:
    """What the pages read: the pool, the stats and workers readers, the
    registry (each registered queue with why it is off, None: on) and the
    clock's schedule."""

    db: Any
    queue_stats: Callable[..., Sequence[Any]]
    workers: Callable[..., Sequence[WorkerInfo]]
    registered: Mapping[str, str | None]
    schedule: Schedule = field(default_factory=lambda: Schedule([]))

    @classmethod
    def of(
        cls,
        db: Any,
        queue_stats: Callable[..., Sequence[Any]],
        workers: Callable[..., Sequence[WorkerInfo]],
        *,
        queues: Iterable[str],
        registered: Mapping[str, str | None],
        schedule: Sequence[Any],
    ) -> Site:
        known: dict[str, str | None] = dict.fromkeys(queues)
        known.update(registered)
        return cls(db, queue_stats, workers, known, Schedule(schedule))

    @property
    def off(self) -> dict[str, str]:
        return {q: why for q, why in self.registered.items() if why}

    def queue_rows(self, now: datetime) -> list[QueueRow]:
        return rows(
            self.db,
            self.queue_stats,
            self.workers(self.db),
            registered=self.registered,
            off=self.off,
            now=now,
        )


def cells(row: QueueRow) -> dict[str, str]:
    """A queue's numbers as the page writes them."""
    s = row.stats
    cap = s.counted_to
    # Counted to its share: every due row was read when a scheduled one was
    # (earliest first), so due alone can be exact; the rest are at least so many.
    at_least = "" if cap is None else "+"
    return {
        "pending": count(s.pending, cap),
        "due": count(s.due, cap),
        "delayed": count(s.delayed) + at_least,
        "running": count(s.running),
        "oldest": overview.age(s.oldest_due_age_s),
        "retrying": count(s.retrying) + at_least,
        "rate": "-" if row.rate is None else f"{row.rate:.3g}/min",
        **{kind: count(n) for kind, n in s.done_1h.items()},
    }


def queues_page(site: Site, window: str | None, now: datetime) -> dict[str, Any]:
    name = timeline.window(window)
    rows = site.queue_rows(now)
    charts = timeline.charts(site.db, "", name, now)
    return {"rows": rows, "charts": charts, "cells": cells, "rate_minutes": RATE_MINUTES}


def queue_page(site: Site, queue: str, now: datetime) -> dict[str, Any] | None:
    """One queue with its charts of the hour and the day; None when it is no queue the page lists."""
    found = [r for r in site.queue_rows(now) if r.queue == queue]
    if not found:
        return None
    charts = [timeline.charts(site.db, queue, name, now) for name in timeline.WINDOWS]
    return {"row": found[0], "charts": charts, "cells": cells}


def workers_page(site: Site) -> dict[str, Any]:
    workers = site.workers(site.db)
    handles = dict(site.db.query(Q.admin_worker_handles, {"ids": [w.id for w in workers]})) if workers else {}
    return {"workers": workers, "handles": handles}


def schedule_page(site: Site, now: datetime) -> dict[str, Any]:
    return {"entries": site.schedule.shown(site.db, now), "entry_cells": entry_cells}


def live(site: Site, page: str, queue: str | None) -> dict[str, str]:
    """The numbers of one page, by the data-live key each has on it."""
    now = datetime.now(UTC)
    numbers = {"updated": now.strftime("%H:%M:%SZ")}
    if page in ("queues", "queue"):
        for row in site.queue_rows(now):
            if page == "queues" or row.queue == queue:
                numbers.update({f"queue:{row.queue}:{k}": v for k, v in cells(row).items()})
    elif page == "workers":
        for w in site.workers(site.db):
            numbers[f"worker:{w.id}:seen"] = ago(w.last_seen)
            numbers[f"worker:{w.id}:holding"] = count(w.holding)
    elif page == "schedule":
        for i, entry in enumerate(site.schedule.shown(site.db, now)):
            numbers.update(entry_cells(i, entry))
    return numbers


def entry_cells(index: int, entry: Entry) -> dict[str, str]:
    return {f"entry:{index}:fired": ago(entry.last_fired) if entry.last_fired else "not in the last 3 days"}
