"""Apply the numbered, forward-only migrations of sql/migrations."""

from __future__ import annotations

import logging
import re
from pathlib import Path

from lib.store.db import DB
from lib.store.sql import MIGRATIONS_DIR, Q

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
    names applied. Each transaction first takes an advisory lock, so processes
    that start together take turns and the second finds nothing left to do.
    The lock is the transaction's, not the session's: behind a pooler in
    transaction mode the next statement may run in another session."""
    applied: list[str] = []
    done: set[int] = set()
    for version, name, path in migrations(folder):
        if version in done:
            continue
        with db.transaction() as tx:
            tx.query_row("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
            tx.exec(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " version int PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            # Read under the lock: another process may have applied it meanwhile.
            done = {row[0] for row in tx.query(Q.migration_applied)}
            if version in done:
                continue
            tx.exec(path.read_text())
            tx.exec(Q.migration_record, {"version": version, "name": name})
        log.info("applied migration %s", name)
        applied.append(name)
    return applied
