"""The charts of the last hour and the last day, for every queue or one:
jobs finished per bucket by kind, start latency (p50, p95) and backlog, read
from the per-minute rollup (job_minutes_since) alone, never from the jobs
table, and drawn as inline SVG by lib/http/charts.py."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from markupsafe import Markup

from lib.http.charts import KINDS, Bucket, buckets, finished_chart, line_chart
from lib.store.sql import Q

# A window's span and the size of its buckets.
WINDOWS = {"hour": (timedelta(hours=1), timedelta(minutes=1)), "day": (timedelta(days=1), timedelta(minutes=10))}
LATENCY = {"latency_p50": "#0b5cad", "latency_p95": "#b3261e"}
BACKLOG = {"backlog": "#7a5200"}


@dataclass(frozen=True)
class Charts:
    window: str
    since: datetime
    until: datetime
    per: str  # what a bucket is: "minute", "10 minutes"
    finished: Markup
    latency: Markup
    backlog: Markup
    totals: dict[str, int]  # finished in the window, by kind
    tops: dict[str, str]  # each chart's top, as its caption says it: "7 a minute", "3.4s", "12 jobs"
    rolled: bool  # any minute of the window was rolled up


def window(asked: str | None) -> str:
    return asked if asked in WINDOWS else "hour"


def charts(db: Any, queue: str, name: str, now: datetime) -> Charts:
    """The window's charts of one queue ('' for every queue)."""
    span, size = WINDOWS[name]
    # Whole buckets up to the one now is in: the minute now is in is not rolled up yet.
    minute = now.replace(second=0, microsecond=0)
    step = int(size.total_seconds() // 60)
    until = minute - timedelta(minutes=minute.minute % step) + size if step > 1 else minute
    since = until - span
    rows = db.query(Q.job_minutes_since, {"queue": queue, "since": since})
    data: list[Bucket] = buckets(rows, since, until, size)
    what = "every queue" if queue == "" else f"queue {queue}"
    per = "minute" if step == 1 else f"{step} minutes"
    return Charts(
        window=name,
        since=since,
        until=until,
        per=per,
        finished=finished_chart(data, f"jobs of {what} finished per {per}, by kind"),
        latency=line_chart(data, f"start latency of {what}, p50 and p95", LATENCY, "s"),
        backlog=line_chart(data, f"backlog due of {what}", BACKLOG, "jobs"),
        totals={kind: sum(b.counts[kind] for b in data) for kind in KINDS},
        tops=_tops(data, per),
        rolled=bool(rows),
    )


def _tops(data: list[Bucket], per: str) -> dict[str, str]:
    finished = max((sum(b.counts.values()) for b in data), default=0)
    latency = max((v for b in data for v in (b.latency_p50, b.latency_p95) if v is not None), default=None)
    backlog = max((b.backlog for b in data if b.backlog is not None), default=None)
    return {
        "finished": f"{finished:,} a {per}" if per == "minute" else f"{finished:,} per {per}",
        "latency": "-" if latency is None else f"{latency:.3g}s",
        "backlog": "-" if backlog is None else f"{backlog:,} jobs",
    }
