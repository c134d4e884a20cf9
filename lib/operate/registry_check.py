"""Check that every writer of a job row names a (queue, name) that a registered
worker handles. Without it such a row stays pending, and only a person who
looks ever sees it.

The writers are the enqueue calls of the project's code (insert and Job, read
with ast), the INSERT INTO jobs statements of sql/ (read with pglast), and the
schedule. Only string literals are read: a queue or name computed at run time
is printed as a warning, never guessed.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import json
import textwrap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lib.job.args import ArgsError, unmarshal_args
from lib.operate.enqueue_sites import Writer, found
from lib.operate.python_enqueue_sites import python_writers
from lib.operate.sql_enqueue_sites import sql_writers


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    writers: list[Writer] = field(default_factory=list)
    handled: dict[str, frozenset[str]] = field(default_factory=dict)


def check(queues: Sequence[Any], schedule: Iterable[Any], root: Path, extra: Iterable[Path] = ()) -> Report:
    """queues: the registry's definitions (lib/run/queue.py: setup_check.defined).
    extra: files and folders outside the project (an application that
    enqueues), read for both Python enqueue calls and SQL."""
    report = Report()
    report.handled = handled(queues, report.problems)
    report.writers += python_writers(root, report.problems, report.warnings)
    report.writers += sql_writers(root, report.problems, report.warnings)
    for path in extra:
        report.writers += python_writers(root, report.problems, report.warnings, files=found(path, ".py"))
        report.writers += sql_writers(root, report.problems, report.warnings, files=found(path, ".sql"))
    schedule = list(schedule)
    report.writers += [Writer("schedule", entry.queue, entry.name) for entry in schedule]
    report.problems += schedule_args_problems(queues, schedule)
    for writer in report.writers:
        names = report.handled.get(writer.queue)
        if names is not None and writer.name in names:
            continue
        why = "no such queue is registered" if names is None else f"queue {writer.queue} does not handle it"
        report.problems.append(f"{writer.where}: queue={writer.queue} job={writer.name} has no worker ({why})")
    return report


def main(queues: Sequence[Any], schedule: Iterable[Any], root: Path, extra: Iterable[Path] = ()) -> int:
    """Print each problem (and warning); 1 if there is any problem, else 0."""
    report = check(queues, schedule, root, extra)
    for line in report.warnings:
        print(f"warning: {line}")
    for line in report.problems:
        print(line)
    if report.problems:
        print(f"registry check failed: {len(report.problems)} problem(s)")
        return 1
    pairs = {(w.queue, w.name) for w in report.writers}
    print(
        f"registry check ok: {len(report.writers)} writers name {len(pairs)} jobs, "
        f"all handled by {len(report.handled)} queues"
    )
    return 0


# Handled pairs


def handled(queues: Sequence[Any], problems: list[str]) -> dict[str, frozenset[str]]:
    """queue -> the job names its definition handles."""
    names: dict[str, frozenset[str]] = {}
    for i, queue in enumerate(queues):
        if queue.name in names:
            # Each poller would claim the other's jobs and fail them as unknown.
            problems.append(f"REGISTRY[{i}]: queue {queue.name!r} is registered twice")
            continue
        names[queue.name] = queue.handles
    return names


# Scheduled args against the dataclass the handler reads them into


def schedule_args_problems(queues: Sequence[Any], schedule: Iterable[Any]) -> list[str]:
    """Each schedule entry whose args do not fit its handler's dataclass
    (a missing field, a field of the wrong type). The dataclass is read from
    the handler's source, never by running it: where it cannot be told (the
    handler does not call unmarshal_args with a dataclass it names), the
    entry is not checked."""
    types = args_types(queues)
    problems = []
    for entry in schedule:
        cls = types.get((entry.queue, entry.name))
        if cls is None:
            continue
        try:
            unmarshal_args(cls, entry.args or {})
        except ArgsError as exc:
            shown = json.dumps(entry.args or {}, sort_keys=True)
            problems.append(f"schedule: queue={entry.queue} job={entry.name} args {shown:.200} do not fit: {exc}")
    return problems


def args_types(queues: Sequence[Any]) -> dict[tuple[str, str], type]:
    """(queue, job name) -> the dataclass its handler reads its args into,
    for each handler where args_type can tell."""
    types: dict[tuple[str, str], type] = {}
    for queue in queues:
        for name, handler in queue.dispatch.items():
            cls = args_type(handler)
            if cls is not None:
                types[(queue.name, name)] = cls
    return types


def args_type(handler: Callable[..., Any], depth: int = 1) -> type | None:
    """The dataclass `handler` passes to unmarshal_args, when its source names
    exactly one, bound in its module or closure; else the same for the
    functions it holds in its closure or partial (a wrapper such as
    lib.run.api_queue's), `depth` levels down. None when it cannot be told."""
    while isinstance(handler, functools.partial):
        handler = handler.func
    handler = inspect.unwrap(handler)
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(handler)))
        bound = inspect.getclosurevars(handler)
    except (OSError, TypeError, SyntaxError):
        return None  # a builtin, a lambda mid-expression, no source at hand
    names = {**bound.builtins, **bound.globals, **bound.nonlocals}
    found = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and (getattr(node.func, "id", None) or getattr(node.func, "attr", None)) == "unmarshal_args"
            and node.args
            and isinstance(node.args[0], ast.Name)
        ):
            cls = names.get(node.args[0].id)
            if isinstance(cls, type) and dataclasses.is_dataclass(cls):
                found.add(cls)
    if len(found) == 1:
        return found.pop()
    if found or depth == 0:
        return None
    inner = {args_type(f, depth - 1) for f in bound.nonlocals.values() if callable(f) and not isinstance(f, type)}
    inner.discard(None)
    return inner.pop() if len(inner) == 1 else None
