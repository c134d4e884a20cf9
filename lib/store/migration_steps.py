"""A migration in steps: how a migration file that must not run as one
transaction is written and read.

A migration that changes a large table while applications write to it
cannot be one transaction: CREATE INDEX CONCURRENTLY cannot run in one, and
a transaction that rewrites every row holds each row it wrote (and any
table lock it took) until it ends. Such a file opens with the line

    -- migrate: in steps

and is a header comment followed by steps, each opened by a line of its own:

    -- step: what it does
        Any SQL, run in one transaction that waits at most a moment for a
        lock and is tried again until it has it. A CREATE INDEX CONCURRENTLY
        IF NOT EXISTS, a DROP INDEX CONCURRENTLY IF EXISTS or an ALTER TABLE
        ... VALIDATE CONSTRAINT alone is run by itself, outside a
        transaction: each takes only locks writers never wait behind.

    -- step, in batches over TABLE: what it does
        One statement, run once per range of TABLE's pages, each run a short
        transaction of its own; it takes the range's rows with
        ctid >= %(from_tid)s::tid AND ctid < %(to_tid)s::tid (and writes a
        literal % as %%).

migrate records each step as it is done (a transaction's step in that
transaction) and the migration as applied once every step is, so a run that
stops anywhere (killed, a failed statement) resumes at the step it was in.
A step must therefore be safe to run again after stopping midway: a
transaction is, a batched statement must touch only rows not yet done, and a
CONCURRENTLY build that failed leaves an INVALID index that migrate drops
before building it again.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

HEADER = "-- migrate: in steps"

_STEP = re.compile(r"^-- step(?:, in batches over (\w+))?: (.+)$", re.MULTILINE)
# Statements that take no lock a writer waits behind, so they run outside a
# transaction and wait as long as they need to.
_ALONE = re.compile(
    r"^(create\s+(unique\s+)?index\s+concurrently|drop\s+index\s+concurrently|alter\s+table\s+\S+\s+validate\s+constraint)\b",
    re.IGNORECASE,
)
_BUILD = re.compile(r"^create\s+(?:unique\s+)?index\s+concurrently\s+if\s+not\s+exists\s+(\w+)\s", re.IGNORECASE)
_DROP = re.compile(r"^drop\s+index\s+concurrently\s+if\s+exists\s", re.IGNORECASE)
_CONCURRENTLY = re.compile(r"\bconcurrently\b", re.IGNORECASE)
_RANGE = ("%(from_tid)s", "%(to_tid)s")


class Kind(enum.Enum):
    TRANSACTION = "transaction"
    ALONE = "alone"  # one statement, outside a transaction
    BATCHES = "batches"


@dataclass(frozen=True)
class Step:
    number: int  # from 1, in the file's order
    what: str
    sql: str
    kind: Kind
    table: str | None = None  # BATCHES: the table whose pages they cover
    index: str | None = None  # ALONE: the index a CONCURRENTLY build makes


def in_steps(text: str) -> bool:
    return text.startswith(HEADER + "\n")


def read_steps(text: str, where: str) -> list[Step]:
    """The steps of a migration in steps; ValueError, naming where, for a
    file migrate could not run safely."""
    parts = _STEP.split(text)
    if _code(parts[0]):
        raise ValueError(f"{where}: only comments come before the first step")
    steps = []
    for number, (table, what, body) in enumerate(zip(parts[1::3], parts[2::3], parts[3::3], strict=True), 1):
        sql = _code(body)
        if not sql:
            raise ValueError(f"{where}: step {number} ({what}) has no statement")
        steps.append(_step(number, what.strip(), sql, table, f"{where}: step {number}"))
    if not steps:
        raise ValueError(f"{where}: a migration in steps has at least one")
    return steps


def check_one_transaction(text: str, where: str) -> None:
    """A migration run as one transaction holds no CONCURRENTLY statement:
    the server refuses one there."""
    if _CONCURRENTLY.search(_code(text)):
        raise ValueError(f"{where}: a CONCURRENTLY statement needs a migration in steps ({HEADER!r})")


def _step(number: int, what: str, sql: str, table: str | None, where: str) -> Step:
    if table is not None:
        if not all(mark in sql for mark in _RANGE) or _several(sql):
            raise ValueError(f"{where}: a batched step is one statement that names %(from_tid)s and %(to_tid)s")
        return Step(number, what, sql, Kind.BATCHES, table=table)
    if not _ALONE.match(sql):
        if _CONCURRENTLY.search(sql):
            raise ValueError(f"{where}: a CONCURRENTLY statement is a step of its own")
        return Step(number, what, sql, Kind.TRANSACTION)
    if _several(sql):
        raise ValueError(f"{where}: a step run outside a transaction is one statement")
    build = _BUILD.match(sql)
    if _CONCURRENTLY.search(sql) and not (build or _DROP.match(sql)):
        # Run again after stopping midway, it must find its work done.
        raise ValueError(f"{where}: a CONCURRENTLY build says IF NOT EXISTS and its name; a drop says IF EXISTS")
    return Step(number, what, sql, Kind.ALONE, index=build.group(1) if build else None)


def _code(text: str) -> str:
    """text without its comment lines and blank lines."""
    return "\n".join(line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("--")).strip()


def _several(sql: str) -> bool:
    return ";" in sql.rstrip().rstrip(";")
