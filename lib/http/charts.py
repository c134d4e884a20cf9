"""Charts of the per-minute rollup (job_minutes), drawn here as SVG: the
admin page serves them inline, with nothing fetched from anywhere else.

A chart covers a window of whole buckets (a minute over the last hour, ten
over the last day). A bucket with no row is drawn empty: no worker rolled
that minute up, or nothing ended in it. Every text in the SVG is escaped.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from markupsafe import Markup, escape

KINDS = ("ok", "fail", "skip", "err")
COLOURS = {"ok": "#2e7d32", "fail": "#ef6c00", "skip": "#9e9e9e", "err": "#c62828"}
WIDTH, HEIGHT = 600, 120


@dataclass(frozen=True)
class Minute:
    """One row of job_minutes, in the columns of job_minutes_since."""

    minute: datetime
    ok: int
    fail: int
    skip: int
    err: int
    latency_p50: float | None
    latency_p95: float | None
    backlog: int | None


@dataclass(frozen=True)
class Bucket:
    start: datetime
    counts: dict[str, int]
    latency_p50: float | None  # the median of its minutes' medians
    latency_p95: float | None  # the worst of its minutes' 95th percentiles
    backlog: int | None  # at its last minute that has one


def buckets(rows: Iterable[Sequence], since: datetime, until: datetime, size: timedelta) -> list[Bucket]:
    """The window [since, until) in buckets of `size`, from job_minutes_since's rows."""
    count = max(1, (until - since) // size)
    grouped: list[list[Minute]] = [[] for _ in range(count)]
    for row in rows:
        minute = Minute(*row)
        index = (minute.minute - since) // size
        if 0 <= index < count:
            grouped[index].append(minute)
    return [_bucket(since + i * size, minutes) for i, minutes in enumerate(grouped)]


def _bucket(start: datetime, minutes: list[Minute]) -> Bucket:
    medians = sorted(m.latency_p50 for m in minutes if m.latency_p50 is not None)
    tails = [m.latency_p95 for m in minutes if m.latency_p95 is not None]
    backlogs = [m.backlog for m in minutes if m.backlog is not None]
    return Bucket(
        start,
        {kind: sum(getattr(m, kind) for m in minutes) for kind in KINDS},
        medians[len(medians) // 2] if medians else None,
        max(tails) if tails else None,
        backlogs[-1] if backlogs else None,
    )


def finished_chart(data: Sequence[Bucket], label: str) -> Markup:
    """Jobs finished per bucket, stacked by kind."""
    top = max((sum(b.counts.values()) for b in data), default=0)
    step = WIDTH / max(len(data), 1)
    bars = []
    for i, bucket in enumerate(data):
        y = float(HEIGHT)
        tip = ", ".join(f"{bucket.counts[k]} {k}" for k in KINDS)
        for kind in KINDS:
            h = HEIGHT * bucket.counts[kind] / top if top else 0.0
            if h:
                y -= h
                bars.append(
                    f'<rect x="{i * step:.2f}" y="{y:.2f}" width="{max(step - 0.5, 0.5):.2f}" height="{h:.2f}"'
                    f' fill="{COLOURS[kind]}"><title>{escape(f"{bucket.start:%H:%M}: {tip}")}</title></rect>'
                )
    return _svg(label, f"finished, at most {top} a bucket", "".join(bars))


def line_chart(data: Sequence[Bucket], label: str, series: dict[str, str], unit: str) -> Markup:
    """Lines of the buckets' attributes named in series (attribute: colour); a
    bucket without a value breaks its line."""
    values = [getattr(b, name) for b in data for name in series]
    top = max((v for v in values if v is not None), default=0) or 1
    step = WIDTH / max(len(data), 1)
    lines = []
    for name, colour in series.items():
        points, runs = [], []
        for i, bucket in enumerate(data):
            value = getattr(bucket, name)
            if value is None:
                runs.append(points)
                points = []
                continue
            points.append(f"{(i + 0.5) * step:.2f},{HEIGHT - HEIGHT * value / top:.2f}")
        runs.append(points)
        for run in runs:
            if len(run) == 1:
                # A value with none beside it (a quiet queue's one busy minute): a dot, as no line can show it.
                x, y = run[0].split(",")
                lines.append(f'<circle cx="{x}" cy="{y}" r="2" fill="{colour}"/>')
            elif run:
                lines.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{" ".join(run)}"/>')
    return _svg(label, f"at most {top:.3g} {unit}", "".join(lines))


def _svg(label: str, scale: str, body: str) -> Markup:
    return Markup(
        f'<svg class="chart" role="img" viewBox="0 0 {WIDTH} {HEIGHT}" preserveAspectRatio="none"'
        f' aria-label="{escape(label)}: {escape(scale)}"><title>{escape(label)}: {escape(scale)}</title>'
        f"{body}</svg>"
    )
