"""The queues and job names the operator's commands know.

The commands act on the queues and job names this checkout's registry has
and those a live worker runs (a worker of another release, or of another
entry point), so that neither a slip goes unnoticed ("0 jobs") nor another
worker's queue is refused.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from lib.background.worker_registry import ALIVE_PERIODS
from lib.store.sql import Q

# An unknown name's line lists at most this many known ones when none is near it.
LISTED_NAMES = 10


def known_handled(db: Any, registered: Mapping[str, Collection[str]]) -> dict[str, frozenset[str]]:
    """queue -> job names: the registry's, and those live workers handle
    (alive as the status command reads it, lib/operate/overview.py)."""
    merged = {queue: set(names) for queue, names in registered.items()}
    for queue, names in db.query(Q.worker_live_handles, {"periods": ALIVE_PERIODS}):
        merged.setdefault(queue, set()).update(names)
    return {queue: frozenset(names) for queue, names in sorted(merged.items())}


def unknown_names(db: Any, args: argparse.Namespace, handled: Mapping[str, Collection[str]]) -> str | None:
    """Why the queue or job name the command is given is none it knows (one
    line, with the nearest known names), or None. A paused queue is known to
    resume (and pause again), and the queues and names of failed jobs to
    failed and redrive, whether or not anything runs them now."""
    command = args.command
    queue, name = getattr(args, "queue", None), getattr(args, "name", None)
    if command in ("pause", "resume"):
        paused = [q for q, _, _ in db.query(Q.queue_paused)]
        where = "registered, run by a live worker or paused"
        return not_known("queue", queue, [*handled, *paused], where)
    if command == "scale":
        return not_known("queue", queue, handled, "registered or run by a live worker")
    if command in ("failed", "redrive", "retry") and (queue is not None or name is not None):
        return _unknown_failed(db, queue, name, handled)
    return None


def _unknown_failed(db: Any, queue: str | None, name: str | None, handled: Mapping[str, Collection[str]]) -> str | None:
    queues, names = set(handled), {n for ns in handled.values() for n in ns}
    if (queue is None or queue in queues) and (name is None or name in names):
        return None  # known without reading the failed rows
    for failed_queue, failed_name in db.query(Q.job_failed_names):
        queues.add(failed_queue)
        names.add(failed_name)
    failed = "or named by a failed job"
    return not_known("queue", queue, queues, f"registered, run by a live worker {failed}") or not_known(
        "job name", name, names, f"handled by a registered queue or a live worker, {failed}"
    )


def not_known(what: str, value: str | None, known: Iterable[str], where: str) -> str | None:
    known = sorted(set(known))
    if value is None or value in known:
        return None
    near = difflib.get_close_matches(value, known, n=3)
    if near:
        hint = f"nearest: {', '.join(near)}"
    elif known:
        more = f", and {len(known) - LISTED_NAMES} more" if len(known) > LISTED_NAMES else ""
        hint = f"known: {', '.join(known[:LISTED_NAMES])}{more}"
    else:
        hint = "none is known"
    return f"no {what} {value!r:.100} is {where} ({hint})"
