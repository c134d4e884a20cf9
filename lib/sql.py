"""The named queries of sql/*.sql, loaded once.

Plain stdlib on purpose: lib.insert imports this from synchronous programs that
must not pull in gevent or the pool.
"""

from __future__ import annotations

import re
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
    """Attribute access to the queries, so a typo fails at import, not at run time."""

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


Q = _Queries(load())
