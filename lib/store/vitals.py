"""The database's vital signs, as the worker's role can read them: what holds
back the MVCC horizon, the jobs table's dead rows, sizes and vacuums, the
NOTIFY queue, transaction-ID ages, and what a migration would need that the
role lacks. One query each (sql/doctor.sql); `worker.py doctor`, /metrics,
the admin page and the horizon watch read them here and judge them where
they show them.

The horizon is the oldest transaction ID whose rows every session may still
need to see. Nothing newer than it can be vacuumed away: while something
holds it, every finished or retried job leaves dead rows in the jobs table
and its indexes, which grow until it ends.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from lib.store.driver_errors import is_lock_timeout
from lib.store.sql import SQL_DIR, Q

# The open transactions read, oldest first: the oldest holds the horizon, and
# a few more show whether one session or a habit of the application does.
TRANSACTIONS_READ = 5
# How long reading the sizes may wait for a relation's lock (a migration's
# ALTER holds one): past it the figures come without sizes rather than late.
SIZES_LOCK_TIMEOUT_MS = 500

_TABLE = re.compile(r"^CREATE TABLE (\w+)", re.MULTILINE)


@dataclass(frozen=True)
class Holder:
    """Something that holds the horizon back: an open transaction, a
    standby's oldest query (its walsender's feedback), a prepared
    transaction, or a replication slot (which may hold none, and only keep
    WAL: xids None)."""

    kind: str  # "transaction", "standby", "prepared" or "slot"
    xids: int | None  # transactions since the ID it holds: how far back; None: it holds none
    seconds: float | None  # open this long; None when the role cannot see it (another role's session, a slot)
    held_xid: str | None  # the transaction ID it holds: with kind and pid or name, which hold this is
    pid: int | None = None
    name: str | None = None  # a slot's name, a prepared transaction's gid
    role: str | None = None
    application: str | None = None
    state: str | None = None
    query: str | None = None  # the first line of its query, when the role may see it
    visible: bool = True  # whether the role sees its query and start (pg_read_all_stats, or its own role)
    active: bool | None = None  # a slot: whether something streams from it now
    slot_type: str | None = None
    catalog_xids: int | None = None  # a logical slot: how far back it holds the catalogs' horizon
    wal_bytes: int | None = None  # a slot: the WAL it keeps from being recycled

    @property
    def key(self) -> Hashable:
        """Which hold this is: the same session or slot holding the same ID."""
        return (self.kind, self.pid, self.name, self.held_xid)

    def label(self) -> str:
        """The holder as an operator finds it: transaction pid 1234 (psql, role app)."""
        if self.kind == "slot":
            what = f"{self.slot_type} replication slot {self.name}"
        elif self.kind == "prepared":
            what = f"prepared transaction {_literal(self.name)}"
        else:
            what = f"{self.kind} pid {self.pid}"
        who = [x for x in (self.application, self.role and f"role {self.role}") if x]
        return f"{what} ({', '.join(who)})" if who else what

    def remedy(self) -> str:
        """What ends the hold, said to a person who may run SQL on the database."""
        if self.kind == "prepared":
            name = _literal(self.name)
            return f"finish it with COMMIT PREPARED {name} or ROLLBACK PREPARED {name} (as its owner or a superuser)"
        if self.kind == "slot":
            return (
                "start the standby or subscriber that reads it; if none will,"
                f" drop it with SELECT pg_drop_replication_slot({_literal(self.name)})"
            )
        if self.kind == "standby":
            return f"end the long query on the standby {self.application or ''}, or turn its hot_standby_feedback off"
        return f"end it with SELECT pg_terminate_backend({self.pid}), or ask its owner to commit or roll back"


@dataclass(frozen=True)
class Vitals:
    """One reading of doctor_vitals. The jobs table's fields are None when
    it does not exist (a database not migrated yet); sizes are None when
    they were not asked for or the table was locked (sizes_note says why)."""

    database: str
    role: str
    superuser: bool
    reads_all_stats: bool  # pg_read_all_stats: sees every session's query and start
    holders: list[Holder]  # open transactions (oldest few), standbys, prepared transactions, slots
    has_jobs: bool
    live_rows: int | None
    dead_rows: int | None
    last_vacuum: datetime | None
    last_autovacuum: datetime | None
    last_analyze: datetime | None
    last_autoanalyze: datetime | None
    jobs_xid_age: int | None
    database_xid_age: int
    notify_usage: float  # the NOTIFY queue's share in use, 0 to 1
    table_bytes: int | None
    total_bytes: int | None  # with indexes and TOAST
    indexes: list[tuple[str, int | None]] = field(default_factory=list)
    now: datetime | None = None  # the database's time of the reading, for the vacuums' ages
    sizes_note: str | None = None
    autovacuum_off: str | None = None  # "server" (autovacuum = off) or "table" (jobs' autovacuum_enabled)

    def horizon(self) -> Holder | None:
        """The holder furthest back: the one whose end moves the horizon."""
        return oldest(self.holders)

    @property
    def hidden(self) -> list[Holder]:
        """Holders whose query and start the role may not see."""
        return [h for h in self.holders if not h.visible]


def oldest(holders: Iterable[Holder]) -> Holder | None:
    """Of the holders that hold rows, the one furthest back (the longer open of two as far back)."""
    holding = [h for h in holders if h.xids is not None]
    return max(holding, key=lambda h: (h.xids, h.seconds or 0.0), default=None)


@dataclass(frozen=True)
class Unowned:
    """Something a migration changes that the role may not: kind is
    database, schema, table or function; fix gives it to the role."""

    kind: str
    name: str
    owner: str
    fix: str


def read(db: Any, *, sizes: bool = True) -> Vitals:
    """The vitals. With sizes, the statement takes the jobs table's and its
    indexes' AccessShareLock, waiting at most SIZES_LOCK_TIMEOUT_MS for one;
    a table locked longer (a migration's ALTER) gives the vitals without
    sizes. Without sizes it takes no lock on them at all."""
    if not sizes:
        return _vitals(db.query_row(Q.doctor_vitals, {"most": TRANSACTIONS_READ, "sizes": False}))
    try:
        bounded = db.lock_bounded(SIZES_LOCK_TIMEOUT_MS)
        return _vitals(bounded.query_row(Q.doctor_vitals, {"most": TRANSACTIONS_READ, "sizes": True}))
    except Exception as exc:
        if not is_lock_timeout(exc):
            raise
    note = f"sizes not read: the jobs table or an index was locked for over {SIZES_LOCK_TIMEOUT_MS} ms"
    return replace(read(db, sizes=False), sizes_note=note)


def unowned(db: Any, tables: Sequence[str] | None = None) -> list[Unowned]:
    """What a migration changes that the role does not own or may not create
    in: the database, the jobs table's schema, the tables (sql/schema.sql's
    by default) and the functions named jobs_*."""
    names = list(tables) if tables is not None else schema_tables()
    return [Unowned(*row) for row in db.query(Q.doctor_owners, {"tables": names})]


def schema_tables() -> list[str]:
    """The tables of sql/schema.sql: those the migrations make and change."""
    return _TABLE.findall((SQL_DIR / "schema.sql").read_text())


# doctor_vitals's columns, in its order.
_COLUMNS = (
    "transactions", "prepared", "slots", "has_jobs", "live_rows", "dead_rows", "last_vacuum", "last_autovacuum",
    "last_analyze", "last_autoanalyze", "autovacuum_server", "autovacuum_table", "jobs_xid_age", "table_bytes",
    "total_bytes", "indexes", "notify_usage", "database_xid_age", "database", "role", "superuser", "reads_all_stats",
    "now",
)  # fmt: skip


def _vitals(row: Any) -> Vitals:
    found = dict(zip(_COLUMNS, row, strict=True))
    holders = [_holder(h) for h in [*found.pop("transactions"), *found.pop("prepared"), *found.pop("slots")]]
    found["indexes"] = [(i["name"], i["bytes"]) for i in found["indexes"]]
    found["notify_usage"] = float(found["notify_usage"])
    server, table = found.pop("autovacuum_server"), found.pop("autovacuum_table")
    found["autovacuum_off"] = "server" if not server else "table" if not table else None
    return Vitals(holders=holders, **found)


_HOLDER_FIELDS = frozenset(Holder.__dataclass_fields__)


def _holder(found: dict[str, Any]) -> Holder:
    fields = {k: v for k, v in found.items() if k in _HOLDER_FIELDS}
    fields.setdefault("seconds", None)
    if fields.get("seconds") is not None:
        fields["seconds"] = float(fields["seconds"])
    return Holder(**fields)


def _literal(text: str | None) -> str:
    return "'" + (text or "").replace("'", "''") + "'"


class Sightings:
    """How long each hold has lasted, at least: its own age where the role
    can see it, else the time since this reader first saw the same hold (a
    slot's, a standby's, another role's session). Holds not seen at the
    last look are forgotten, so one that ends and comes back counts anew."""

    def __init__(self) -> None:
        self._first: dict[Hashable, float] = {}

    def look(self, holders: Iterable[Holder], now: float) -> None:
        """Note the holds seen at now (a monotonic clock's time)."""
        seen = {h.key for h in holders if h.xids is not None}
        self._first = {key: self._first.get(key, now) for key in seen}

    def held_for(self, holder: Holder, now: float) -> float | None:
        """Seconds the holder has held at least; None when neither its age
        nor an earlier sighting says."""
        since = self._first.get(holder.key)
        watched = None if since is None else now - since
        if holder.seconds is None:
            return watched
        return max(holder.seconds, watched or 0.0)
