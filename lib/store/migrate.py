"""Bring a database to this release's schema: the numbered, forward-only
migrations of sql/migrations (tables, columns, indexes, data moves), then the
rules of sql/rules (every function and trigger, each defined in one file,
the one in force).

The database is the application's: every transaction here waits at most
LOCK_TIMEOUT_MS for a lock and is tried again after a pause when it cannot
have it, so a busy table delays the upgrade, never the application's writes
queued behind a waiting ALTER. A migration that would hold a large table
for longer (a rewrite of every row, an index build, a check of every row)
is written in steps (lib/store/migration_steps.py): batches of short
transactions, and statements that hold no writer.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from lib.store.db import DB, Tx
from lib.store.driver_errors import is_lock_timeout
from lib.store.migration_lock import MigrationsLock
from lib.store.migration_steps import Kind, Step, check_one_transaction, in_steps, read_steps
from lib.store.retry_backoff import Backoff
from lib.store.sql import MIGRATIONS_DIR, SQL_DIR, Q

log = logging.getLogger("jobs.migrate")

RULES_DIR = SQL_DIR / "rules"

_FILE = re.compile(r"^(\d+)_\w+\.sql$")
# How long a migration waits for a lock before it lets go and tries again: an
# application's write queued behind a waiting ALTER waits no longer than this.
LOCK_TIMEOUT_MS = 200
# The pages of a table one batch of a batched step covers: a batch holds the
# rows it rewrote until it commits, and a writer of one of them waits that long.
BATCH_PAGES = 64
PROGRESS_EVERY = 30.0  # seconds between the lines that say how far a batched step is
# What migrate keeps of its own: the migrations applied, and the steps done
# of a migration in steps that is not yet.
_TABLES = """
CREATE TABLE IF NOT EXISTS schema_migrations (
  version int PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS schema_migration_steps (
  version int NOT NULL, step int NOT NULL, done_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (version, step));
"""

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
    """Apply the migrations not yet applied, then the rules (None: none, for
    a test that leaves a database as an older release did); the names of the
    migrations applied. The whole run holds the migrations' lock
    (lib/store/migration_lock.py), so processes that start together take
    turns and the second finds nothing left to do."""
    applied: list[str] = []
    with MigrationsLock(db) as lock:
        _in_transaction(db, "the migrations' own tables", lambda tx: tx.exec(_TABLES))
        done = {row[0] for row in db.query(Q.migration_applied)}
        for version, name, path in migrations(folder):
            if version in done:
                continue
            lock.check()
            _apply_migration(db, lock, version, name, path.read_text())
            log.info("applied migration %s", name)
            applied.append(name)
        if rules is not None:
            lock.check()
            changed = _in_transaction(db, "the rules", lambda tx: _apply_rules(tx, Rules.read(rules)))
            if changed:
                log.info("applied the rules of %s", ", ".join(changed))
    return applied


def _apply_migration(db: DB, lock: MigrationsLock, version: int, name: str, text: str) -> None:
    """One migration: in one transaction, or step by step (a migration in
    steps, lib/store/migration_steps.py), recorded as applied only once all
    of it is done."""
    if not in_steps(text):
        check_one_transaction(text, f"{name}.sql")
        _in_transaction(db, name, lambda tx: _one_transaction(tx, version, name, text))
        return
    steps = read_steps(text, f"{name}.sql")
    done = {row[0] for row in db.query(Q.migration_steps_done, {"version": version})}
    for step in steps:
        if step.number in done:
            continue
        lock.check()
        log.info("migration %s, step %d of %d: %s", name, step.number, len(steps), step.what)
        _run_step(db, version, f"{name} step {step.number}", step)
    lock.check()
    _in_transaction(db, name, lambda tx: _record(tx, version, name))


def _one_transaction(tx: Tx, version: int, name: str, text: str) -> None:
    if _has_statements(text):  # a migration whose functions moved to sql/rules is a comment alone
        tx.exec(text)
    tx.exec(Q.migration_record, {"version": version, "name": name})


def _record(tx: Tx, version: int, name: str) -> None:
    tx.exec(Q.migration_record, {"version": version, "name": name})
    tx.exec(Q.migration_steps_forget, {"version": version})


def _run_step(db: DB, version: int, what: str, step: Step) -> None:
    """One step, then its record: in the step's own transaction when it has
    one; after it otherwise, and a step stopped between the two is run again,
    finding its work done."""
    record = {"version": version, "step": step.number}

    def step_and_record(tx: Tx) -> None:
        tx.exec(step.sql)
        tx.exec(Q.migration_step_record, record)

    if step.kind is Kind.TRANSACTION:
        _in_transaction(db, what, step_and_record)
        return
    if step.kind is Kind.ALONE:
        _retried(what, lambda: _alone(db, step))
    else:
        _batches(db, what, step)
    _in_transaction(db, what, lambda tx: tx.exec(Q.migration_step_record, record))


def _alone(db: DB, step: Step) -> None:
    """A statement outside a transaction. A CONCURRENTLY build that failed or
    was stopped left its index INVALID (never used, yet found by IF NOT
    EXISTS): it is dropped and built again."""
    if step.index is not None and db.query_row(Q.migration_index_invalid, {"index": step.index})[0]:
        log.info("dropping the INVALID index %s an earlier build left, to build it again", step.index)
        db.exec(f"DROP INDEX CONCURRENTLY IF EXISTS {step.index}")
    db.exec(step.sql)


def _batches(db: DB, what: str, step: Step) -> None:
    """A batched step over the table's pages as they are when it starts:
    rows written later are the migration's trigger's to keep in step."""
    (pages,) = db.query_row(Q.migration_table_pages, {"table": step.table})
    log.info("%s: %d pages of %s, %d at a time", what, pages, step.table, BATCH_PAGES)
    said = time.monotonic()
    for first in range(0, pages, BATCH_PAGES):
        tids = {"from_tid": f"({first},0)", "to_tid": f"({first + BATCH_PAGES},0)"}
        _in_transaction(db, what, lambda tx, tids=tids: tx.exec(step.sql, tids))
        if time.monotonic() - said >= PROGRESS_EVERY:
            log.info("%s: %d of %d pages done", what, first + BATCH_PAGES, pages)
            said = time.monotonic()


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


def _in_transaction(db: DB, what: str, work: Callable[[Tx], T]) -> T:
    """work(tx) in a transaction that waits at most LOCK_TIMEOUT_MS for any
    lock, tried again until it has the locks it needs."""

    def attempt() -> T:
        with db.transaction() as tx:
            tx.exec(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}")
            return work(tx)

    return _retried(what, attempt)


def _retried(what: str, attempt: Callable[[], T]) -> T:
    """attempt() until it does not fail for want of a lock, with backoff. One
    line when it has to wait, and one when it is through."""
    retry = Backoff(base=0.1, cap=5.0)
    began = time.monotonic()
    while True:
        try:
            done = attempt()
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
