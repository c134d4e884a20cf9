"""The named queries of sql/*.sql, loaded once.

Plain stdlib on purpose: lib.insert imports this from synchronous programs that
must not pull in gevent or the pool.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SQL_DIR = ROOT / "sql"
MIGRATIONS_DIR = SQL_DIR / "migrations"

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
# A "-- plan: custom" line in a query's comment: the pool never prepares it,
# so every run is planned for its values. A filter written
# "(%(x)s IS NULL OR col = %(x)s)" becomes an index range only then: the
# generic plan a prepared statement may switch to from its sixth run is made
# without the values, and reads every row the rest of the query allows.
_PLAN = re.compile(r"^-- plan: (.*?)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class Named:
    sql: str
    custom_plan: bool  # "-- plan: custom": sent with its values, never prepared


def parse(text: str) -> dict[str, Named]:
    """Split a file of "-- name: X" sections into {X: its query}."""
    parts = _NAME.split(text)
    queries: dict[str, Named] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        plans = _PLAN.findall(body)
        if any(plan != "custom" for plan in plans):
            raise ValueError(f'query {name!r}: a plan line says "-- plan: custom" or nothing, not {plans}')
        sql = "\n".join(line for line in body.splitlines() if not line.startswith("--"))
        queries[name] = Named(sql.strip(), custom_plan=bool(plans))
    return queries


class _Queries:
    """Attribute access to the queries: a misspelt name is an AttributeError
    that names it, where it is used."""

    def __init__(self, queries: dict[str, str]) -> None:
        self.__dict__.update(queries)

    def names(self) -> set[str]:
        return set(self.__dict__)


def load(folder: Path = SQL_DIR) -> dict[str, Named]:
    """Every named query of every sql/*.sql file; a name defined twice is an error."""
    queries: dict[str, Named] = {}
    for path in sorted(folder.glob("*.sql")):
        for name, query in parse(path.read_text()).items():
            if name in queries:
                raise ValueError(f"query {name!r} is defined twice ({path.name})")
            queries[name] = query
    return queries


@dataclass(frozen=True)
class Statement:
    """A named query in the two forms a connection needs to run it prepared:
    planned once per connection instead of on every call."""

    name: str
    params: tuple[str, ...]  # the %(name)s parameters, in $1, $2... order
    prepare: str  # PREPARE name AS ... $1 ...
    execute: str  # EXECUTE name(%s, ...), for the driver to fill in
    template: bytes  # the same, for lib.store.db to fill in with literals it wrote itself


_PARAM = re.compile(r"%\((\w+)\)s")


def statement(name: str, sql: str) -> Statement:
    params = tuple(dict.fromkeys(_PARAM.findall(sql)))
    positional = _PARAM.sub(lambda m: f"${params.index(m.group(1)) + 1}", sql).replace("%%", "%")
    args = f"({', '.join(['%s'] * len(params))})" if params else ""
    execute = f"EXECUTE {name}{args}"
    return Statement(name, params, f"PREPARE {name} AS {positional}", execute, execute.encode())


_QUERIES = load()
Q = _Queries({name: query.sql for name, query in _QUERIES.items()})
# The named queries the pool runs prepared, by text, so it recognises one it
# is handed without a second API; a custom-plan query is not among them.
STATEMENTS = {q.sql: statement(name, q.sql) for name, q in _QUERIES.items() if not q.custom_plan}
