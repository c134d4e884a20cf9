"""The named queries of sql/*.sql, loaded once.

Plain stdlib on purpose: lib.insert imports this from synchronous programs that
must not pull in gevent or the pool.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SQL_DIR = ROOT / "sql"
MIGRATIONS_DIR = SQL_DIR / "migrations"

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def parse(text: str) -> dict[str, str]:
    """Split a file of "-- name: X" sections into {X: sql}."""
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        sql = "\n".join(line for line in body.splitlines() if not line.startswith("--"))
        queries[name] = sql.strip()
    return queries


class _Queries:
    """Attribute access to the queries: a misspelt name is an AttributeError
    that names it, where it is used."""

    def __init__(self, queries: dict[str, str]) -> None:
        self.__dict__.update(queries)

    def names(self) -> set[str]:
        return set(self.__dict__)


def load(folder: Path = SQL_DIR) -> dict[str, str]:
    """Every named query of every sql/*.sql file; a name defined twice is an error."""
    queries: dict[str, str] = {}
    for path in sorted(folder.glob("*.sql")):
        for name, sql in parse(path.read_text()).items():
            if name in queries:
                raise ValueError(f"query {name!r} is defined twice ({path.name})")
            queries[name] = sql
    return queries


@dataclass(frozen=True)
class Statement:
    """A named query in the two forms a connection needs to run it prepared:
    planned once per connection instead of on every call."""

    name: str
    params: tuple[str, ...]  # the %(name)s parameters, in $1, $2... order
    prepare: str  # PREPARE name AS ... $1 ...
    execute: str  # EXECUTE name(%s, ...), for the driver to fill in


_PARAM = re.compile(r"%\((\w+)\)s")


def statement(name: str, sql: str) -> Statement:
    params = tuple(dict.fromkeys(_PARAM.findall(sql)))
    positional = _PARAM.sub(lambda m: f"${params.index(m.group(1)) + 1}", sql).replace("%%", "%")
    args = f"({', '.join(['%s'] * len(params))})" if params else ""
    return Statement(name, params, f"PREPARE {name} AS {positional}", f"EXECUTE {name}{args}")


_QUERIES = load()
Q = _Queries(_QUERIES)
# By text, so the pool recognises a named query it is handed without a second API.
STATEMENTS = {sql: statement(name, sql) for name, sql in _QUERIES.items()}
