"""The places in Python that enqueue: the enqueue calls of lib.insert (insert and
Job), read with ast; only string literals are read."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

from lib.operate.enqueue_sites import Writer, where_of

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


def python_files(root: Path) -> Iterator[Path]:
    for top in CODE:
        path = root / top
        if path.is_file():
            yield path
        elif path.is_dir():
            yield from sorted(p for p in path.rglob("*.py") if "__pycache__" not in p.parts)


def python_writers(
    root: Path, problems: list[str], warnings: list[str], files: Iterable[Path] | None = None
) -> list[Writer]:
    """files: the project's own (CODE) unless given."""
    writers: list[Writer] = []
    for path in python_files(root) if files is None else files:
        where = where_of(path, root)
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
