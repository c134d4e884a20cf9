"""Check that every writer of a job row names a (queue, name) that a registered
worker handles. Without it such a row stays pending, and only a person who
looks ever sees it.

The writers are the enqueue calls of the project's code (insert and Job, read
with ast), the INSERT INTO jobs statements of sql/, and the schedule. Only
string literals are read: a queue or name computed at run time is printed as a
warning, never guessed.
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

from lib.args import ArgsError, unmarshal_args
from lib.db import DB

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
    report.writers += sql_writers(root, report.warnings)
    for path in extra:
        report.writers += python_writers(root, report.problems, report.warnings, files=_found(path, ".py"))
        report.writers += sql_writers(root, report.warnings, files=_found(path, ".sql"))
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


def args_type(handler: Callable[..., Any], depth: int = 1) -> type | None:
    """The dataclass `handler` passes to unmarshal_args, when its source names
    exactly one, bound in its module or closure; else the same for the
    functions it holds in its closure or partial (a wrapper such as
    lib.api_queue's), `depth` levels down. None when it cannot be told."""
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


# SQL: INSERT INTO jobs (..., queue, name, ...) VALUES (...) | SELECT ...

_TOKEN = re.compile(
    r"""
    (?P<skip>\s+|--[^\n]*|/\*.*?\*/)
  | (?P<string>[eE]?'(?:[^']|'')*')
  | (?P<dollar>\$(?P<tag>[A-Za-z_]\w*)?\$.*?\$(?(tag)(?P=tag))\$)
  | (?P<param>%\(\w+\)s|%s|\$\d+)
  | (?P<ident>"(?:[^"]|"")*"|[A-Za-z_][\w$]*)
  | (?P<other>::|.)
    """,
    re.VERBOSE | re.DOTALL,
)
# Where a SELECT list ends.
_SELECT_END = {"from", "where", "group", "having", "order", "limit", "on", "returning", "union", "except", "intersect"}


@dataclass(frozen=True)
class _Token:
    kind: str
    text: str
    line: int

    @property
    def word(self) -> str:
        """An identifier as Postgres reads it; other tokens as written."""
        if self.kind != "ident":
            return self.text
        return self.text[1:-1].replace('""', '"') if self.text.startswith('"') else self.text.lower()


def sql_files(root: Path) -> list[Path]:
    return sorted((root / "sql").rglob("*.sql"))


def sql_writers(root: Path, warnings: list[str], files: Iterable[Path] | None = None) -> list[Writer]:
    """Literal pairs of every INSERT INTO jobs in sql/, or in files (migrations'
    DDL has none; a data migration that enqueues is a writer like any other)."""
    writers: list[Writer] = []
    for path in sql_files(root) if files is None else files:
        where = _where(path, root)
        for statement in _statements(path.read_text()):
            for start in range(len(statement)):
                if _is_insert_into_jobs(statement, start):
                    writers += _read_insert(statement, start, where, warnings)
    return writers


def _statements(text: str, line: int = 1) -> Iterator[list[_Token]]:
    """Tokens per statement; a "-- name:" line starts a new one as a ; does.
    The body of a dollar-quoted function is read too: a trigger may enqueue."""
    statement: list[_Token] = []
    for match in _TOKEN.finditer(text):
        kind = match.lastgroup or "other"
        token = _Token(kind, match.group(), line)
        if kind == "dollar":
            quote = len(match.group("tag") or "") + 2
            yield from _statements(token.text[quote:-quote], line)
        line += token.text.count("\n")
        ends = token.text == ";" or (kind == "skip" and token.text.startswith("-- name:"))
        if ends:
            if statement:
                yield statement
            statement = []
        elif kind != "skip":
            statement.append(token)
    if statement:
        yield statement


def _is_insert_into_jobs(tokens: list[_Token], i: int) -> bool:
    words = [t.word for t in tokens[i : i + 5]]
    if words[:2] != ["insert", "into"]:
        return False
    return words[2:3] == ["jobs"] or words[2:5] == ["public", ".", "jobs"]


def _read_insert(tokens: list[_Token], start: int, file: str, warnings: list[str]) -> list[Writer]:
    where = f"{file}:{tokens[start].line}"
    i = start + (3 if tokens[start + 2].word == "jobs" else 5)
    if i >= len(tokens) or tokens[i].text != "(":
        warnings.append(f"{where}: INSERT INTO jobs without a column list; not checked")
        return []
    columns, i = _group(tokens, i)
    names = [" ".join(t.word for t in column) for column in columns]
    if "queue" not in names or "name" not in names:
        warnings.append(f"{where}: INSERT INTO jobs without queue and name columns; not checked")
        return []
    rows = _rows(tokens, i)
    if rows is None:
        warnings.append(f"{where}: INSERT INTO jobs neither VALUES nor SELECT; not checked")
        return []
    # A statement that takes parameters gets its pair from its Python caller,
    # which is what the check reads (lib.insert's own queries are such). So
    # does a function's, whose arguments are named p_* (migration 015's
    # jobs_insert, called by lib.insert's queries).
    parameterized = any(t.kind == "param" or t.word.startswith("p_") for t in tokens[start:])
    writers = []
    for row in rows:
        if len(row) != len(names):
            warnings.append(f"{where}: INSERT INTO jobs with {len(names)} columns but {len(row)} values; not checked")
            continue
        pair = [_sql_value(row[names.index(column)]) for column in ("queue", "name")]
        if all(isinstance(v, str) for v in pair):
            writers.append(Writer(where, pair[0], pair[1]))
        elif not parameterized:
            shown = ", ".join(" ".join(t.text for t in row[names.index(c)]) for c in ("queue", "name"))
            warnings.append(f"{where}: INSERT INTO jobs queue/name are not literals ({shown}); not checked")
    return writers


def _rows(tokens: list[_Token], i: int) -> list[list[list[_Token]]] | None:
    """Each row's value expressions, from VALUES (...), (...) or SELECT a, b [UNION SELECT ...]."""
    word = tokens[i].word if i < len(tokens) else ""
    if word == "values":
        rows = []
        i += 1
        while i < len(tokens) and tokens[i].text == "(":
            row, i = _group(tokens, i)
            rows.append(row)
            if i < len(tokens) and tokens[i].text == ",":
                i += 1
        return rows
    if word != "select":
        return None
    rows = []
    while i < len(tokens) and tokens[i].word == "select":
        i += 1
        if i < len(tokens) and tokens[i].word in ("distinct", "all"):
            i += 1
        row, i = _select_list(tokens, i)
        rows.append(row)
        i = _next_select(tokens, i)
    return rows


def _group(tokens: list[_Token], i: int) -> tuple[list[list[_Token]], int]:
    """The comma-separated items of the parenthesised group at tokens[i]; the index after it."""
    items: list[list[_Token]] = [[]]
    depth = 0
    for j in range(i, len(tokens)):
        text = tokens[j].text
        if text == "(":
            depth += 1
            if depth == 1:
                continue
        elif text == ")":
            depth -= 1
            if depth == 0:
                return items, j + 1
        if depth == 1 and text == ",":
            items.append([])
        else:
            items[-1].append(tokens[j])
    return items, len(tokens)


def _select_list(tokens: list[_Token], i: int) -> tuple[list[list[_Token]], int]:
    items: list[list[_Token]] = [[]]
    depth = 0
    while i < len(tokens):
        token = tokens[i]
        if depth == 0 and ((token.kind == "ident" and token.word in _SELECT_END) or token.text == ")"):
            break  # a ) here closes the CTE or subquery the INSERT sits in
        depth += (token.text == "(") - (token.text == ")")
        if depth == 0 and token.text == ",":
            items.append([])
        else:
            items[-1].append(token)
        i += 1
    return [_strip_alias(item) for item in items], i


def _strip_alias(item: list[_Token]) -> list[_Token]:
    """'caches' AS queue, or 'caches' queue: the value without its alias."""
    if len(item) >= 3 and item[-2].word == "as":
        return item[:-2]
    if len(item) == 2 and item[0].kind == "string" and item[1].kind == "ident":
        return item[:1]
    return item


def _next_select(tokens: list[_Token], i: int) -> int:
    """Past the FROM ... of one SELECT to the SELECT after its UNION, if any."""
    depth = 0
    while i < len(tokens):
        token = tokens[i]
        if depth == 0 and token.text == ")":
            return i  # the end of the CTE or subquery the INSERT sits in
        depth += (token.text == "(") - (token.text == ")")
        if depth == 0 and token.word in ("union", "except", "intersect"):
            i += 1
            if i < len(tokens) and tokens[i].word in ("all", "distinct"):
                i += 1
            return i
        i += 1
    return i


def _sql_value(expr: list[_Token]) -> str | None:
    """A string literal, with or without a cast ('caches', 'caches'::text); None otherwise."""
    if not expr or expr[0].kind != "string":
        return None
    rest = expr[1:]
    cast = len(rest) >= 2 and rest[0].text == "::" and all(t.kind == "ident" for t in rest[1:])
    if rest and not cast:
        return None
    text = expr[0].text
    if text[0] in "eE":
        return None  # escapes would need decoding; no job name needs them
    return text[1:-1].replace("''", "'")
