"""Apply the numbered, forward-only migrations of sql/migrations."""

from __future__ import annotations

import logging
import re
from pathlib import Path

from lib.db import DB
from lib.sql import MIGRATIONS_DIR, Q

log = logging.getLogger("jobs.migrate")

# Any fixed number will do; every process that migrates this database takes it.
_LOCK_KEY = 0x6A6F6273  # "jobs"
_FILE = re.compile(r"^(\d+)_\w+\.sql$")


def migrations(folder: Path = MIGRATIONS_DIR) -> list[tuple[int, str, Path]]:
    found: dict[int, Path] = {}
    for path in sorted(folder.iterdir()):
        match = _FILE.match(path.name)
        if not match:
            raise ValueError(f"{path.name}: a migration is named NNN_what.sql")
        version = int(match.group(1))
        if version in found:
            raise ValueError(f"two migrations numbered {version}: {found[version].name}, {path.name}")
        found[version] = path
    return [(v, p.stem, p) for v, p in sorted(found.items())]


def migrate(db: DB, folder: Path = MIGRATIONS_DIR) -> list[str]:
    """Apply the migrations not yet applied, each in its own transaction; the
    names applied. An advisory lock makes processes that start together take
    turns, and the second finds nothing left to do."""
    pending = migrations(folder)
    applied: list[str] = []
    with db.connection() as conn, conn.cursor() as cur:
        cur.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
        try:
            cur.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " version int PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            cur.execute(Q.migration_applied)
            done = {row[0] for row in cur.fetchall()}
            for version, name, path in pending:
                if version in done:
                    continue
                cur.execute("BEGIN")
                try:
                    cur.execute(path.read_text())
                    cur.execute(Q.migration_record, {"version": version, "name": name})
                    cur.execute("COMMIT")
                except BaseException:
                    if not conn.closed:
                        cur.execute("ROLLBACK")
                    raise
                log.info("applied migration %s", name)
                applied.append(name)
        finally:
            if not conn.closed:
                cur.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))
    return applied
