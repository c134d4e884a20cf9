"""The layers of lib/, lowest first: a module imports only its own layer and
the layers below that the table allows. Read from the source (every import
statement of lib/**/*.py, inside functions and TYPE_CHECKING blocks too), so
an import that runs late or only for a type checker still counts.

    lib.job                        the handler API: nothing of the engine
    lib.setup, lib.greenlets       settings, logs, errors; gevent helpers
    lib.store, lib.clients         psycopg2 and the named queries; API clients
    lib.background, lib.run        rescue, clock, registry; the poller pipeline
    lib.operate, lib.http          operator commands; HTTP endpoints
    lib.adapters                   frameworks' own ways to enqueue and run (Django tasks)
    lib.insert                     what applications import: lib.store.sql only

Each layer's allowed set is as tight as the code allows: an import the
intended order permits but nothing makes yet is one word to add here, where a
reviewer sees it. An import that breaks the intended order is listed in
BREAKS by name, and a test fails once it is gone, so the list only shrinks."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from tests_support import ROOT

LIB = ROOT / "lib"

# The packages that tie a module to the engine: the gevent hub, the pool's driver.
ENGINE = frozenset({"gevent", "psycopg2", "psycopg", "psycogreen"})

# layer: (the layers of lib it may import besides its own, the engine packages it may import)
ALLOWED: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "lib.job": (frozenset(), frozenset()),
    "lib.setup": (frozenset({"lib.job"}), frozenset()),
    "lib.greenlets": (frozenset({"lib.setup"}), frozenset({"gevent"})),
    "lib.store": (frozenset({"lib.setup", "lib.greenlets"}), frozenset({"gevent", "psycopg2", "psycogreen"})),
    "lib.clients": (frozenset({"lib.setup"}), frozenset()),
    "lib.background": (
        frozenset({"lib.job", "lib.setup", "lib.greenlets", "lib.store", "lib.insert"}),
        frozenset({"gevent"}),
    ),
    "lib.run": (
        frozenset(
            {"lib.job", "lib.setup", "lib.greenlets", "lib.store", "lib.clients", "lib.insert", "lib.background"}
        ),
        frozenset({"gevent"}),
    ),
    "lib.operate": (frozenset({"lib.job", "lib.setup", "lib.store", "lib.insert", "lib.background"}), frozenset()),
    "lib.http": (frozenset({"lib.job", "lib.setup", "lib.store", "lib.operate"}), frozenset({"gevent"})),
    "lib.insert": (frozenset(), frozenset()),  # and lib.store.sql alone: INSERT_IMPORTS
    # The web process imports the backends: engine packages never, the pool
    # never (lib.store.sql is lib.insert's own); the worker's side, queue definitions.
    "lib.adapters": (frozenset({"lib.job", "lib.insert", "lib.run", "lib.store"}), frozenset()),
}

# The intended order, for the names of what each layer sits above: a module
# may import a layer of a lower rank (lib.insert counts as the store's rank:
# it stands on lib.store.sql alone, and the engine enqueues through it too).
RANK = {
    "lib.job": 0,
    "lib.setup": 1,
    "lib.greenlets": 1,
    "lib.store": 2,
    "lib.insert": 2,
    "lib.clients": 2,
    "lib.background": 3,
    "lib.run": 3,
    "lib.operate": 4,
    "lib.http": 4,
    "lib.adapters": 4,
}

# lib.insert runs in programs without gevent: these modules, and nothing else of lib.
INSERT_IMPORTS = frozenset({"lib.store.sql"})

# Imports that break the intended order today, each by file and what it imports
# (the engine package, or the module of lib), with what it is there for.
BREAKS: dict[tuple[str, str], str] = {
    ("lib/setup/embedded/__init__.py", "lib.store.sql"): "the repository root, for the embedded server's data folder",
    ("lib/setup/plain_connection.py", "psycopg2"): "a plain psycopg2 connection for scripts, outside the pool",
    ("lib/setup/error_reports.py", "psycopg2"): "parse_dsn, to mask the password of a database URL",
    ("lib/setup/parsers.py", "psycopg2"): "parse_dsn, to check DATABASE_URL when the settings are read",
    ("lib/setup/dsn.py", "psycopg2"): "parse_dsn, to find the password of a database URL",
    ("lib/background/leases.py", "psycopg2"): "the heartbeat's own connection, in a native thread",
}


@dataclass(frozen=True)
class Import:
    file: str  # relative to the repository root
    line: int
    module: str  # what it names, absolute: lib.store.sql, gevent.event


def module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str | None:
    """The layer a module of lib belongs to; None for lib itself."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else None


def imports_of(path: Path) -> list[Import]:
    """Every module the file imports. `from a import b` names a.b when that is
    a module of lib (a submodule), else a (b is a name inside it)."""
    package = module_of(path) if path.name == "__init__.py" else module_of(path).rpartition(".")[0]
    file = str(path.relative_to(ROOT))
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [Import(file, node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append(Import(file, node.lineno, sub if _is_module(sub) else base))
    return found


def _is_module(module: str) -> bool:
    if not module.startswith("lib."):
        return False
    path = ROOT.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def lib_files() -> list[Path]:
    return sorted(LIB.rglob("*.py"))


def problems(imp: Import) -> str | None:
    """Why this import breaks its file's layer; None when it keeps it."""
    layer = layer_of(module_of(ROOT / imp.file))
    if layer is None:
        return None  # lib/__init__.py
    lib_layers, engine = ALLOWED[layer]
    top = imp.module.split(".")[0]
    if top in ENGINE:
        return None if top in engine else f"{layer} imports no {', '.join(sorted(ENGINE))}"
    if top != "lib":
        return None
    if layer == "lib.insert":
        return None if imp.module in INSERT_IMPORTS else f"lib.insert imports only {', '.join(sorted(INSERT_IMPORTS))}"
    target = layer_of(imp.module)
    if target is None or target == layer or target in lib_layers:
        return None
    allowed = ", ".join(sorted(lib_layers)) or "nothing of lib"
    above = " (a layer above it)" if RANK.get(target, 99) >= RANK[layer] else ""
    return f"{layer} may import its own modules and {allowed}, not {target}{above}"


def breaking_imports() -> list[tuple[Import, str]]:
    found = []
    for path in lib_files():
        for imp in imports_of(path):
            why = problems(imp)
            if why is not None:
                found.append((imp, why))
    return found


def _key(imp: Import) -> tuple[str, str]:
    """How BREAKS names an import: the file, and the engine package or the module of lib."""
    top = imp.module.split(".")[0]
    return imp.file, top if top in ENGINE else imp.module


def test_every_module_of_lib_is_in_a_layer():
    """A new sub-package of lib is placed in the table before it is imported."""
    unplaced = sorted({layer_of(module_of(p)) for p in lib_files()} - set(ALLOWED) - {None})
    assert unplaced == [], f"lib sub-packages with no row in ALLOWED: {unplaced}"
    assert set(RANK) == set(ALLOWED)


def test_no_module_imports_a_layer_it_may_not():
    unlisted = [
        f"{imp.file}:{imp.line} imports {imp.module}: {why}"
        for imp, why in breaking_imports()
        if _key(imp) not in BREAKS
    ]
    assert unlisted == [], "\n".join(unlisted)


def test_each_listed_break_is_still_there():
    """A break that was mended leaves the list with it: the list only shrinks."""
    present = {_key(imp) for imp, _ in breaking_imports()}
    mended = sorted(set(BREAKS) - present)
    assert mended == [], f"no longer imported, so no longer an exception: {mended}"


def test_the_handler_api_imports_nothing_of_the_engine():
    """Stated on its own, whatever BREAKS holds: lib.job imports only lib.job
    of lib, and no gevent or database driver, so a queue's handlers and any
    program can import it."""
    bad = [
        f"{imp.file}:{imp.line} imports {imp.module}"
        for path in lib_files()
        if layer_of(module_of(path)) == "lib.job"
        for imp in imports_of(path)
        if imp.module.split(".")[0] in ENGINE or (imp.module.startswith("lib.") and layer_of(imp.module) != "lib.job")
    ]
    assert bad == [], "\n".join(bad)


def reached_from(start: str) -> set[str]:
    """Every module of lib that importing start imports (their packages'
    __init__ too); AssertionError naming the line when one imports an engine package."""
    reached: set[str] = set()
    todo = [start]
    while todo:
        module = todo.pop()
        if module in reached:
            continue
        reached.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:n]) for n in range(1, len(parts))]  # the packages Python imports first
        path = ROOT.joinpath(*parts)
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        for imp in imports_of(path):
            top = imp.module.split(".")[0]
            assert top not in ENGINE, f"{imp.file}:{imp.line} imports {imp.module}, and {start} reaches it"
            if top == "lib":
                todo.append(imp.module)
    return reached


def test_insert_and_all_it_imports_stay_free_of_gevent_and_the_pool():
    """An application without gevent imports lib.insert: every module of lib
    it reaches (its packages' __init__ too) imports no engine package."""
    assert reached_from("lib.insert") == {"lib", "lib.insert", "lib.store", "lib.store.sql"}


def test_the_django_backend_reaches_nothing_of_lib_but_insert():
    """A Django web process imports the tasks backend: it reaches lib.insert
    and what lib.insert does, and no engine package."""
    assert reached_from("lib.adapters.django_tasks") == {
        "lib", "lib.adapters", "lib.adapters.django_tasks", "lib.insert", "lib.store", "lib.store.sql",
    }  # fmt: skip
