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
import re
import textwrap
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pglast import ast as pg
from pglast import parse_plpgsql
from pglast.enums import SetOperation
from pglast.parser import ParseError, parse_sql, scan
from pglast.stream import RawStream

from lib.job.args import ArgsError, unmarshal_args
from lib.store.db import DB

# The project's own code; tests, benchmarks and the virtualenv enqueue on purpose
# what no worker handles.
CODE = ("worker.py", "lib", "queues")
# Enqueue functions of lib.insert: where their queue and name arguments sit.
_POSITIONS = {"insert": (1, 2), "Job": (0, 1)}
# insert_many takes Job values; each Job(...) call is the writer it names.
_ENQUEUE = {*_POSITIONS, "insert_many"}
# Written on the first line of an enqueue call whose queue and name come from
# a person at run time and are checked there against handled() (the enqueue
# command): nothing to read here, and nothing to warn about.
RUN_TIME_CHECKED = "# registry-check: names checked at run time"


@dataclass(frozen=True)
class Writer:
    where: str  # file:line relative to the root, or "schedule"
    queue: str
    name: str


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    writers: list[Writer] = field(default_factory=list)
    handled: dict[str, frozenset[str]] = field(default_factory=dict)


def check(
    registry: Iterable[Callable[[DB], Any]], schedule: Iterable[Any], root: Path, extra: Iterable[Path] = ()
) -> Report:
    """extra: files and folders outside the project (an application that
    enqueues), read for both Python enqueue calls and SQL."""
    report = Report()
    report.handled = handled(registry, report.problems)
    report.writers += python_writers(root, report.problems, report.warnings)
    report.writers += sql_writers(root, report.problems, report.warnings)
    for path in extra:
        report.writers += python_writers(root, report.problems, report.warnings, files=_found(path, ".py"))
        report.writers += sql_writers(root, report.problems, report.warnings, files=_found(path, ".sql"))
    schedule = list(schedule)
    report.writers += [Writer("schedule", entry.queue, entry.name) for entry in schedule]
    report.problems += schedule_args_problems(registry, schedule)
    for writer in report.writers:
        names = report.handled.get(writer.queue)
        if names is not None and writer.name in names:
            continue
        why = "no such queue is registered" if names is None else f"queue {writer.queue} does not handle it"
        report.problems.append(f"{writer.where}: queue={writer.queue} job={writer.name} has no worker ({why})")
    return report


def main(
    registry: Iterable[Callable[[DB], Any]], schedule: Iterable[Any], root: Path, extra: Iterable[Path] = ()
) -> int:
    """Print each problem (and warning); 1 if there is any problem, else 0."""
    report = check(registry, schedule, root, extra)
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


def handled(registry: Iterable[Callable[[DB], Any]], problems: list[str]) -> dict[str, frozenset[str]]:
    """queue -> the job names its poller handles. The pool never connects: the
    constructors only keep it."""
    db = DB("postgresql:///unused", size=1)
    queues: dict[str, frozenset[str]] = {}
    for i, make in enumerate(registry):
        label = f"{getattr(make, '__module__', '?')}.{getattr(make, '__qualname__', repr(make))}"
        try:
            poller = make(db)
        except Exception as exc:
            problems.append(f"REGISTRY[{i}] ({label}) raised {type(exc).__name__}: {exc}")
            continue
        if poller.queue in queues:
            # Each poller would claim the other's jobs and fail them as unknown.
            problems.append(f"REGISTRY[{i}] ({label}): queue {poller.queue!r} is registered twice")
            continue
        queues[poller.queue] = frozenset(poller.handles)
    return queues


# Scheduled args against the dataclass the handler reads them into


def schedule_args_problems(registry: Iterable[Callable[[DB], Any]], schedule: Iterable[Any]) -> list[str]:
    """Each schedule entry whose args do not fit its handler's dataclass
    (a missing field, a field of the wrong type). The dataclass is read from
    the handler's source, never by running it: where it cannot be told (the
    handler does not call unmarshal_args with a dataclass it names), the
    entry is not checked."""
    types = args_types(registry)
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


def args_types(registry: Iterable[Callable[[DB], Any]]) -> dict[tuple[str, str], type]:
    """(queue, job name) -> the dataclass its handler reads its args into,
    for each handler where args_type can tell."""
    types: dict[tuple[str, str], type] = {}
    db = DB("postgresql:///unused", size=1)
    for make in registry:
        try:
            poller = make(db)
        except Exception:
            continue  # handled() reports it
        for name, handler in poller.dispatch.items():
            cls = args_type(handler)
            if cls is not None:
                types[(poller.queue, name)] = cls
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


# Python: insert(db, queue, name, ...) and Job(queue, name, ...)


def python_files(root: Path) -> Iterator[Path]:
    for top in CODE:
        path = root / top
        if path.is_file():
            yield path
        elif path.is_dir():
            yield from sorted(p for p in path.rglob("*.py") if "__pycache__" not in p.parts)


def _found(path: Path, suffix: str) -> list[Path]:
    """path itself when it is such a file; else the files of that kind under
    it, leaving out hidden folders (.venv, .git) and caches."""
    if path.is_file():
        return [path] if path.suffix == suffix else []
    return sorted(
        p
        for p in path.rglob(f"*{suffix}")
        if not any(
            part.startswith(".") or part in ("__pycache__", "site-packages") for part in p.relative_to(path).parts
        )
    )


def _where(path: Path, root: Path) -> str:
    """A file as a problem names it: relative to the project, else as it is."""
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)


def python_writers(
    root: Path, problems: list[str], warnings: list[str], files: Iterable[Path] | None = None
) -> list[Writer]:
    """files: the project's own (CODE) unless given."""
    writers: list[Writer] = []
    for path in python_files(root) if files is None else files:
        where = _where(path, root)
        try:
            text = path.read_text()
            tree = ast.parse(text, filename=where)
        except (SyntaxError, UnicodeDecodeError) as exc:
            problems.append(f"{where}: cannot be read for enqueue calls: {exc}")
            continue
        lines = text.splitlines()
        for call, kind in _enqueue_calls(tree):
            if kind == "insert_many" or RUN_TIME_CHECKED in lines[call.lineno - 1]:
                continue
            writer = _literal_pair(call, kind, f"{where}:{call.lineno}")
            if isinstance(writer, Writer):
                writers.append(writer)
            else:
                warnings.append(writer)
    return writers


def _enqueue_calls(tree: ast.Module) -> Iterator[tuple[ast.Call, str]]:
    """Calls of lib.insert's enqueue functions, by their bare name, by an alias
    imported from lib.insert, or as an attribute of the lib.insert module. A
    file that defines one of the names itself (lib/insert.py) is the
    definition, not a writer; `.insert` on anything else is a list's."""
    functions, modules, defined = _bindings(tree)
    calls = sorted((n for n in ast.walk(tree) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset))
    for node in calls:
        func = node.func
        if isinstance(func, ast.Name):
            kind = functions.get(func.id) or (func.id if func.id in _ENQUEUE else None)
            if kind and func.id not in defined:
                yield node, kind
        elif (
            isinstance(func, ast.Attribute)
            and func.attr in _ENQUEUE
            and isinstance(func.value, ast.Name)
            and func.value.id in modules
        ):
            yield node, func.attr


def _bindings(tree: ast.Module) -> tuple[dict[str, str], set[str], set[str]]:
    functions: dict[str, str] = {}  # local name -> enqueue function
    modules: set[str] = set()  # local names of the lib.insert module
    defined: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "lib.insert":
            for alias in node.names:
                if alias.name in _ENQUEUE:
                    functions[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module == "lib":
            modules |= {alias.asname or alias.name for alias in node.names if alias.name == "insert"}
        elif isinstance(node, ast.Import):
            modules |= {alias.asname for alias in node.names if alias.name == "lib.insert" and alias.asname}
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name in _ENQUEUE:
            defined.add(node.name)
    return functions, modules, defined


def _literal_pair(call: ast.Call, kind: str, where: str) -> Writer | str:
    """The Writer when queue and name are both string literals; else the warning."""
    values = []
    for field_name, position in zip(("queue", "name"), _POSITIONS[kind], strict=True):
        value = _argument(call, field_name, position)
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            values.append(value.value)
        else:
            shown = ast.unparse(call)
            shown = shown if len(shown) <= 100 else shown[:97] + "..."
            return f"{where}: {field_name} is not a string literal in {shown}; not checked"
    return Writer(where, values[0], values[1])


def _argument(call: ast.Call, keyword: str, position: int) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == keyword:
            return kw.value
    before = call.args[:position]
    if len(call.args) > position and not any(isinstance(a, ast.Starred) for a in before):
        return call.args[position]
    return None


# SQL: every INSERT INTO jobs, read by Postgres's own parser (pglast wraps
# libpg_query, the server's grammar as a library): CTEs, INSERT ... SELECT,
# quoting, dollar quoting and comments mean here what they mean to the server.

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
        sql_file = _SqlFile(_where(path, root), problems, warnings)
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
            # such), or whoever calls the function (migration 015's jobs_insert).
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
