"""Bring a database to this release's schema: the numbered, forward-only
migrations of sql/migrations (tables, columns, indexes, data moves), then the
rules of sql/rules (every function and trigger, each defined in one file,
the one in force).

The database is the application's: every transaction here waits at most
LOCK_TIMEOUT_MS for a table lock and is tried again after a pause when it
cannot have it, so a busy table delays the upgrade, never the application's
writes queued behind a waiting ALTER.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from lib.greenlets.backoff import Backoff
from lib.store.db import DB, Tx
from lib.store.errors import is_lock_timeout
from lib.store.sql import MIGRATIONS_DIR, SQL_DIR, Q

log = logging.getLogger("jobs.migrate")

RULES_DIR = SQL_DIR / "rules"

# Any fixed number will do; every process that migrates this database takes it.
_LOCK_KEY = 0x6A6F6273  # "jobs"
_FILE = re.compile(r"^(\d+)_\w+\.sql$")
# How long a migration waits for a lock before it lets go and tries again: an
# application's write queued behind a waiting ALTER waits no longer than this.
LOCK_TIMEOUT_MS = 200

T = TypeVar("T")


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


@dataclass(frozen=True)
class Rules:
    """The rules of a release: its files in the order they apply, and the
    version sql/rules/VERSION gives them. A database whose rules are of a
    newer version keeps them: an older release started beside a newer one
    (a rolling upgrade) must not put its own back."""

    version: int
    checksum: str  # as VERSION states it; tests hold it to the files
    files: tuple[Path, ...]

    @classmethod
    def read(cls, folder: Path = RULES_DIR) -> Rules:
        version, checksum, names = None, None, []
        for line in (folder / "VERSION").read_text().splitlines():
            word, _, value = line.partition(" ")
            if not line.strip() or line.startswith("#"):
                continue
            if word == "version":
                version = int(value)
            elif word == "checksum":
                checksum = value.strip()
            else:
                names.append(line.strip())
        if version is None or checksum is None or not names:
            raise ValueError(f"{folder / 'VERSION'}: needs a version line, a checksum line and the files")
        return cls(version, checksum, tuple(folder / name for name in names))

    def digest(self) -> str:
        """The files' checksum, as VERSION should state it."""
        # Imported here: hashlib loads OpenSSL's digests, memory a worker keeps
        # for nothing (the database computes the checksums migrate compares).
        import hashlib

        whole = hashlib.sha256()
        for path in self.files:
            whole.update(f"{path.name}\n".encode() + path.read_bytes())
        return whole.hexdigest()


def migrate(db: DB, folder: Path = MIGRATIONS_DIR, rules: Path | None = RULES_DIR) -> list[str]:
    """Apply the migrations not yet applied, each in its own transaction,
    then the rules (None: none, for a test that leaves a database as an
    older release did); the names of the migrations applied. Each
    transaction first takes an advisory lock, so processes that start together
    take turns and the second finds nothing left to do. The lock is the
    transaction's, not the session's: behind a pooler in transaction mode the
    next statement may run in another session."""
    applied: list[str] = []
    for version, name, path in migrations(folder):
        if _locked(db, name, lambda tx, v=version, n=name, p=path: _apply_migration(tx, v, n, p)):
            log.info("applied migration %s", name)
            applied.append(name)
    if rules is not None:
        changed = _locked(db, "the rules", lambda tx: _apply_rules(tx, Rules.read(rules)))
        if changed:
            log.info("applied the rules of %s", ", ".join(changed))
    return applied


def _apply_migration(tx: Tx, version: int, name: str, path: Path) -> bool:
    tx.exec(
        "CREATE TABLE IF NOT EXISTS schema_migrations ("
        " version int PRIMARY KEY, name text NOT NULL,"
        " applied_at timestamptz NOT NULL DEFAULT now())"
    )
    # Read under the lock: another process may have applied it meanwhile.
    if version in {row[0] for row in tx.query(Q.migration_applied)}:
        return False
    text = path.read_text()
    if _has_statements(text):  # a migration whose functions moved to sql/rules is a comment alone
        tx.exec(text)
    tx.exec(Q.migration_record, {"version": version, "name": name})
    return True


def _apply_rules(tx: Tx, rules: Rules) -> list[str]:
    """The rule files whose text differs from what the database holds, applied
    in one transaction (the functions switch together); the names applied.
    Nothing when the database holds a newer release's rules."""
    tx.exec(
        "CREATE TABLE IF NOT EXISTS schema_rules ("
        " file text PRIMARY KEY, checksum text NOT NULL, version int NOT NULL,"
        " applied_at timestamptz NOT NULL DEFAULT now())"
    )
    (newest,) = tx.query_row(Q.rules_newest)
    if newest > rules.version:
        log.info(
            "the rules in force are a newer release's (version %d); this one's (%d) are left", newest, rules.version
        )
        return []
    texts = {path.name: path.read_text() for path in rules.files}
    due = tx.query(Q.rules_due, {"files": list(texts), "texts": list(texts.values()), "version": rules.version})
    changed = []
    for name, text_changed, _ in due:
        if text_changed:
            tx.exec(texts[name])
            changed.append(name)
        tx.exec(Q.rules_record, {"file": name, "text": texts[name], "version": rules.version})
    return changed


def _locked(db: DB, what: str, work: Callable[[Tx], T]) -> T:
    """work(tx) in a transaction that holds the migrations' advisory lock and
    waits at most LOCK_TIMEOUT_MS for any other lock; tried again, with
    backoff, until it has the locks it needs. One line when it has to wait,
    and one when it is through."""
    retry = Backoff(base=0.1, cap=5.0)
    began = time.monotonic()
    while True:
        try:
            with db.transaction() as tx:
                tx.query_row("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
                tx.exec(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}")
                done = work(tx)
        except Exception as exc:
            if not is_lock_timeout(exc):
                raise
            if not retry.failures:
                log.warning(
                    "%s waits for a lock another transaction holds (on the jobs table, say: an open"
                    " transaction that wrote to it); trying again until it is free, writers never waiting"
                    " behind it for more than %d ms",
                    what,
                    LOCK_TIMEOUT_MS,
                )
            time.sleep(retry.failed())
            continue
        if retry.failures:
            log.warning(
                "%s had its locks after %d tries over %.1fs", what, retry.failures + 1, time.monotonic() - began
            )
        return done


def _has_statements(text: str) -> bool:
    return any(line.strip() and not line.lstrip().startswith("--") for line in text.splitlines())
