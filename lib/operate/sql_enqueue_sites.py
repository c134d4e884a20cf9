"""The places in SQL that enqueue: every INSERT INTO jobs of sql/, read by
Postgres's own parser (pglast wraps libpg_query, the server's grammar as a
library): CTEs, INSERT ... SELECT, quoting, dollar quoting and comments mean
here what they mean to the server."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pglast import ast as pg
from pglast import parse_plpgsql
from pglast.enums import SetOperation
from pglast.parser import ParseError, parse_sql, scan
from pglast.stream import RawStream

from lib.operate.enqueue_sites import Writer, where_of

# A "-- name: X" line starts the next of a file's named queries (lib/store/sql.py):
# they need no ; between them.
_NAMED = re.compile(r"^(?=-- name:)", re.MULTILINE)
# psycopg2's placeholders, which are not SQL.
_PLACEHOLDER = re.compile(r"%\(\w+\)s|%s")
# The table as its (schema, name): unqualified, or in the schema it is made in.
_JOBS = {(None, "jobs"), ("public", "jobs")}


def sql_files(root: Path) -> list[Path]:
    return sorted((root / "sql").rglob("*.sql"))


def sql_writers(
    root: Path, problems: list[str], warnings: list[str], files: Iterable[Path] | None = None
) -> list[Writer]:
    """Literal pairs of every INSERT INTO jobs in sql/, or in files (migrations'
    DDL has none; a data migration that enqueues is a writer like any other),
    and in the bodies of the functions they create: a trigger may enqueue."""
    writers: list[Writer] = []
    for path in sql_files(root) if files is None else files:
        sql_file = _SqlFile(where_of(path, root), problems, warnings)
        text = _NAMED.sub(";", path.read_text())
        try:
            sql_file.read(_numbered(text))
        except ParseError as exc:
            sql_file.unreadable(text, 1, exc)  # the scanner's: an unterminated quote or comment
        writers += sql_file.writers
    return writers


def _numbered(sql: str) -> str:
    """psycopg2's placeholders as $1, as lib/store/sql.py prepares the named queries
    (with $1, $2...: one number does here, where only the statement's shape is
    read). Only where the scanner sees an operator: in a string, a quoted
    identifier or a comment the same characters are left as written."""
    operators = {i for t in scan(sql) if t.name in ("ASCII_37", "Op") for i in range(t.start, t.end + 1)}
    return _PLACEHOLDER.sub(lambda match: "$1" if match.start() in operators else match.group(), sql)


@dataclass
class _SqlFile:
    """One file's writers, and what in it cannot be read (a problem, as for Python)."""

    where: str
    problems: list[str]
    warnings: list[str]
    writers: list[Writer] = field(default_factory=list)

    def read(self, sql: str, line: int = 1, arguments: frozenset[str] = frozenset()) -> None:
        """The statements in sql, which starts on the file's `line`; arguments:
        those of the function whose body it is."""
        try:
            statements = parse_sql(sql)
        except ParseError as exc:
            self.unreadable(sql, line, exc)
            return
        for raw in statements:
            names = arguments
            if isinstance(raw.stmt, pg.CreateFunctionStmt):
                names |= {p.name for p in raw.stmt.parameters or () if p.name}
            if isinstance(raw.stmt, pg.CreateFunctionStmt | pg.DoStmt):
                self.read_body(raw, sql, line, names)
            nodes = list(_nodes(raw.stmt))
            # A statement that takes parameters gets its pair from its caller:
            # the Python code the check reads (lib.insert's own queries are
            # such), or whoever calls the function (jobs_insert, sql/rules/insert.sql).
            parameterized = any(
                isinstance(n, pg.ParamRef)
                or (isinstance(n, pg.ColumnRef) and getattr(n.fields[0], "sval", "") in names)
                for n in nodes
            )
            for node in nodes:
                if isinstance(node, pg.InsertStmt) and (node.relation.schemaname, node.relation.relname) in _JOBS:
                    where = f"{self.where}:{_line(sql, line, node.relation.location)}"
                    self.read_insert(node, where, parameterized)

    def read_body(self, raw: pg.RawStmt, sql: str, line: int, arguments: frozenset[str]) -> None:
        """The body of a function (or a DO block) in SQL or PL/pgSQL: a trigger may enqueue."""
        stmt = raw.stmt
        options = {o.defname: o for o in (stmt.args if isinstance(stmt, pg.DoStmt) else stmt.options) or ()}
        if "as" not in options:
            return  # BEGIN ATOMIC: its statements are in the tree already
        language = options["language"].arg.sval if "language" in options else "plpgsql"  # DO's default
        quoted = options["as"].arg
        body = (quoted[0] if isinstance(quoted, tuple) else quoted).sval
        first = _line(sql, line, options["as"].arg_location)
        if language == "sql":
            self.read(body, first, arguments)
            return
        if language != "plpgsql":
            return  # C, Python...: no SQL to read
        end = raw.stmt_location + raw.stmt_len if raw.stmt_len else len(sql)
        try:
            function = parse_plpgsql(sql[raw.stmt_location : end])
        except ParseError as exc:
            self.unreadable("", first, exc)  # with no position: at the body's first line
            return
        lines = body.splitlines(keepends=True)
        for query, lineno in _plpgsql_statements(function):
            # A statement's text starts at its first word, which may be on a
            # line after the one PL/pgSQL names (RETURN QUERY\n INSERT ...).
            start = sum(map(len, lines[: lineno - 1]))
            at = max(body.find(query.partition("\n")[0], start), start)
            self.read(query, _line(body, first, at), arguments)

    def read_insert(self, insert: pg.InsertStmt, where: str, parameterized: bool) -> None:
        names = [column.name for column in insert.cols or ()]
        if not names:
            self.warnings.append(f"{where}: INSERT INTO jobs without a column list; not checked")
            return
        if "queue" not in names or "name" not in names:
            self.warnings.append(f"{where}: INSERT INTO jobs without queue and name columns; not checked")
            return
        for row in _rows(insert.selectStmt):  # never DEFAULT VALUES: that takes no column list
            if len(row) != len(names):
                self.warnings.append(
                    f"{where}: INSERT INTO jobs with {len(names)} columns but {len(row)} values; not checked"
                )
                continue
            values = [row[names.index(column)] for column in ("queue", "name")]
            queue, name = (_literal(value) for value in values)
            if queue is not None and name is not None:
                self.writers.append(Writer(where, queue, name))
            elif not parameterized:
                shown = ", ".join(RawStream()(value) for value in values)
                self.warnings.append(f"{where}: INSERT INTO jobs queue/name are not literals ({shown}); not checked")

    def unreadable(self, sql: str, line: int, exc: ParseError) -> None:
        """A problem at the position the parser names; none is the end of sql."""
        message, position = exc.args
        at = _line(sql, line, len(sql) if position is None else position)
        self.problems.append(f"{self.where}:{at}: cannot be read: {message}")


def _plpgsql_statements(tree: Any, lineno: int = 1) -> Iterator[tuple[str, int]]:
    """Each SQL statement of a parsed PL/pgSQL body, with its line in the body.
    Expressions (IF's, RETURN's) are left out: an INSERT cannot be in one."""
    if isinstance(tree, list):
        for item in tree:
            yield from _plpgsql_statements(item, lineno)
    elif isinstance(tree, dict):
        lineno = tree.get("lineno", lineno)
        expr = tree.get("PLpgSQL_expr")
        if expr is not None and expr.get("parseMode", 0) == 0:  # RAW_PARSE_DEFAULT: a whole statement
            yield expr["query"], lineno
        for value in tree.values():
            yield from _plpgsql_statements(value, lineno)


def _nodes(node: Any) -> Iterator[pg.Node]:
    """node and every node under it."""
    if isinstance(node, tuple):
        for item in node:
            yield from _nodes(item)
    elif isinstance(node, pg.Node):
        yield node
        for attribute in node:
            yield from _nodes(getattr(node, attribute))


def _line(sql: str, line: int, position: int) -> int:
    """The file's line of sql[position], sql starting on the file's `line`."""
    return line + sql.count("\n", 0, position)


def _rows(select: pg.SelectStmt) -> list[tuple[pg.Node, ...]]:
    """Each row's value expressions: VALUES (...), (...), or SELECT a, b, and
    the rows a UNION adds (an EXCEPT's or INTERSECT's right side adds none)."""
    if select.larg is not None:
        right = _rows(select.rarg) if select.op == SetOperation.SETOP_UNION else []
        return _rows(select.larg) + right
    if select.valuesLists:
        return [tuple(row) for row in select.valuesLists]
    return [tuple(target.val for target in select.targetList or ())]


def _literal(value: pg.Node) -> str | None:
    """A string literal, cast or not ('caches', 'caches'::text); None otherwise."""
    while isinstance(value, pg.TypeCast):
        value = value.arg
    if isinstance(value, pg.A_Const) and isinstance(value.val, pg.String):
        return value.val.sval
    return None
