"""Statements bound to their values: named queries run prepared, and the
values the worker's own statements carry written without the driver."""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from typing import Any

import psycopg2
import psycopg2.extensions

from lib.store.driver_errors import Unsendable
from lib.store.sql import STATEMENTS

Params = dict[str, Any] | Sequence[Any] | None
Row = tuple[Any, ...]

# The named queries each connection has prepared; a connection that is closed
# and collected takes its entry with it, as the server does its statements.
_prepared: weakref.WeakKeyDictionary[psycopg2.extensions.connection, set[str]] = weakref.WeakKeyDictionary()


def bind(cur: psycopg2.extensions.cursor, sql: str, params: Params, prepare: bool) -> bytes:
    """The statement to send, its parameters bound. A named query of sql/
    with named parameters is run prepared (PREPAREd on this connection the
    first time, then an EXECUTE): planning the claim's CTEs cost more than
    running them."""
    stmt = STATEMENTS.get(sql) if prepare and (params is None or isinstance(params, dict)) else None
    if stmt is None:
        return _mogrify(cur, sql, params)
    done = _prepared.setdefault(cur.connection, set())
    if stmt.name not in done:
        cur.execute(stmt.prepare)
        done.add(stmt.name)
    if not params:
        return _mogrify(cur, stmt.execute, None)
    values = [params[name] for name in stmt.params]
    literals = [literal(value) for value in values]
    if None in literals:
        return _mogrify(cur, stmt.execute, values)
    return stmt.template % tuple(literals)


def _mogrify(cur: psycopg2.extensions.cursor, sql: str, params: Params) -> bytes:
    """cur.mogrify, its refusal of a value raised as Unsendable: it sends nothing."""
    try:
        return cur.mogrify(sql, params)
    except (ValueError, TypeError, psycopg2.ProgrammingError) as exc:
        if isinstance(exc, psycopg2.Error) and exc.pgcode is not None:
            raise
        raise Unsendable(f"{type(exc).__name__}: {exc}") from exc


def literal(value: Any) -> bytes | None:
    """value as the driver's mogrify writes it, byte for byte, for the values
    the worker's own statements carry on every job (ids, counts, seconds, a
    queue, a worker id, a plain status); None for any other value, and the
    driver then binds them all. The driver finds an adapter for each value
    through its registry, several times what writing them here takes
    (docs/performance.md). A string that
    needs quoting or escaping, or a value of any other type, is still the
    driver's to write."""
    kind = type(value)
    if value is None:
        return b"NULL"
    if kind is int:
        # A space before a minus, as the driver writes it: "-" after "-" would start a comment.
        return b"%d" % value if value >= 0 else b" %d" % value
    if kind is str:
        plain = value.isascii() and value.isprintable() and "'" not in value and "\\" not in value
        return b"'" + value.encode() + b"'" if plain else None
    if kind is float:
        # repr reads back as the same float8; the driver writes infinities and NaN its own way.
        if not math.isfinite(value):
            return None
        text = repr(value).encode()
        return b" " + text if text.startswith(b"-") else text
    if kind is bool:
        return b"true" if value else b"false"
    return None


def array_text(values: list[Any]) -> str:
    """A batch's column of ints, floats, strings and Nones as the text
    Postgres's array input reads, for the statement to cast (jobs_step's
    %(...)s::bigint[] and so on). It is a string like any other, which bind
    writes as its literal: the driver then adapts no value of the batch
    (docs/performance.md). A NUL character still raises the driver's
    ValueError when it quotes the column."""
    return "{" + ",".join([_element(v) for v in values]) + "}"


def _element(value: Any) -> str:
    kind = type(value)
    if kind is int or kind is float:  # most of a batch's values, and the cheapest test
        return repr(value)  # float8in reads inf and nan too
    if value is None:
        return "NULL"
    if isinstance(value, str):
        # Quoted, so "NULL", commas and braces stay text; inside, backslash and double quote are escaped.
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, bool):
        raise TypeError("no array element for bool")
    # Subclasses (an IntEnum, numpy's float64) as the plain number they are: their repr may be another text.
    if isinstance(value, int):
        return repr(int(value))
    if isinstance(value, float):
        return repr(float(value))
    raise TypeError(f"no array element for {type(value).__name__}")
