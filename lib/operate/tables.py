"""How the operator's commands print: padded tables for a person, JSON for a
script, times in UTC, long text cut to one line."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import IO, Any

from lib.operate import overview
from lib.operate.overview import QueueStats, WorkerInfo
from lib.setup.logs import one_line

# A redrive lists at most this many ids on its summary line.
LISTED_IDS = 50
# The characters of a step's result shown in a listing (`show`, the admin page).
PREVIEW_CHARS = 120
# A pause until resumed is stored as infinity, which the driver reads as this.
FOREVER = datetime.max.replace(tzinfo=UTC)


def is_tty(stream: IO[str]) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def worker_row(w: WorkerInfo, now: datetime, *, holding: bool = False) -> list[Any]:
    seen = f"{overview.age((now - w.last_seen).total_seconds())} ago"
    return [w.id, w.host, w.pid, time_text(w.started_at), seen, *([w.holding] if holding else []), ", ".join(w.queues)]


def print_json(out: IO[str], value: Any) -> None:
    print(json.dumps(value, indent=2, default=_json_default, ensure_ascii=False), file=out)


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def print_table(out: IO[str], headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Columns padded to their widest cell; the last is not padded (a reason
    or a list of queues may be long)."""
    cells = [list(headers), *[[one_line(str(c)) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        line = "  ".join(c.ljust(w) for c, w in zip(row[:-1], widths, strict=False))
        print(f"{line}  {row[-1]}".rstrip(), file=out)


def time_text(value: datetime | None) -> str:
    if value is None:
        return "-"
    if value == FOREVER:
        return "never"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def pause_text(s: QueueStats) -> str:
    if s.paused_until is None:
        return "-"
    until = "until resumed" if s.paused_until == FOREVER else f"until {time_text(s.paused_until)}"
    return f"{until}: {s.pause_reason}"


def cut(text: str, width: int) -> str:
    text = one_line(text)
    return text if len(text) <= width else text[: width - 1] + "…"


def compact_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def preview(value: Any, width: int = PREVIEW_CHARS) -> str:
    """A JSON value as compact text on one line, cut to width."""
    return cut(compact_json(value), width)


def ids_text(ids: Sequence[int]) -> str:
    if not ids:
        return ""
    shown = ", ".join(map(str, ids[:LISTED_IDS]))
    more = f", and {len(ids) - LISTED_IDS} more" if len(ids) > LISTED_IDS else ""
    return f": {shown}{more}"


def print_steps(listed: Sequence[tuple[str, Any, Any]], total: int, out: IO[str]) -> None:
    """A job's steps (name, when stored, result), a preview of each result."""
    print(f"steps ({total}), kept for the job's later runs:", file=out)
    width = max(len(one_line(name)) for name, _, _ in listed) + 2
    for name, at, result in listed:
        print(f"  {one_line(name):<{width}}{time_text(at)}  {preview(result)}", file=out)
    if total > len(listed):
        print(f"  and {total - len(listed)} more", file=out)


def print_waits(waits: overview.JobWaits, out: IO[str]) -> None:
    """What a job waits for now, and what waits for it (insert's after=)."""
    for what, jobs in (("waits for", waits.waits_for), ("waited for by", waits.waited_by)):
        if jobs:
            print(f"{what}: " + ", ".join(f"{i} ({one_line(s or 'deleted')[:60]})" for i, s in jobs), file=out)
