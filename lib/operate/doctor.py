"""`worker.py doctor`: the database's vital signs (lib/store/vitals.py), each
judged ok, warning or bad, with what to do when it is not ok. The admin
page's database page shows the same findings.

The judgement is pure: findings() takes the vitals and the thresholds, so a
test sets a threshold instead of waiting for one to pass.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, field
from typing import IO, Any

from lib.background.horizon_watch import HELD_TOO_LONG
from lib.operate import overview
from lib.operate.tables import print_json
from lib.setup.logs import one_line
from lib.store.driver_errors import is_database_error
from lib.store.vitals import Holder, Unowned, Vitals, read, unowned

OK, WARNING, BAD = "ok", "warning", "bad"
_RANK = {OK: 0, WARNING: 1, BAD: 2}


@dataclass(frozen=True)
class Thresholds:
    # An application's transaction lasts well under a second; one open for
    # minutes was left open (a psql session, a stuck request), and every job
    # that ends meanwhile leaves dead rows the table keeps until it ends.
    horizon_warning: float = 300.0
    # The horizon watch's own threshold: what the worker logs and reports.
    horizon_bad: float = HELD_TOO_LONG
    # Where the role cannot see how long (a slot, a standby, another role's
    # session), how far back in transactions: about as many dead row
    # versions as the rest of the database's writes could have left since.
    horizon_xids_warning: int = 100_000
    horizon_xids_bad: int = 1_000_000
    # autovacuum's default scale factor: dead rows past this share of the
    # table mean vacuum is behind, or cannot remove them (a held horizon).
    dead_share_warning: float = 0.2
    dead_share_bad: float = 0.5
    # Fewer dead rows than this cost a claim nothing worth a word.
    dead_rows_floor: int = 10_000
    # A table with dead rows past the floor that no vacuum reached for this
    # long is one autovacuum does not get to (off, or its workers all busy).
    vacuum_stale: float = 86_400.0
    # NOTIFY fails once the queue is full, and with it every commit that
    # enqueued a job (the insert notifies): a listener that stopped reading
    # (a LISTEN session left in a transaction) fills it.
    notify_warning: float = 0.1
    notify_bad: float = 0.5
    # autovacuum freezes at autovacuum_freeze_max_age (200 million by
    # default): far past it, freezing is not keeping up; the server stops
    # assigning transaction IDs about 2.1 billion in, to prevent wraparound.
    xid_age_warning: int = 500_000_000
    xid_age_bad: int = 1_500_000_000


# The thresholds the command and the admin page judge by (a test sets its own).
THRESHOLDS = Thresholds()


@dataclass(frozen=True)
class Finding:
    name: str
    verdict: str  # ok, warning or bad
    summary: str
    details: list[str] = field(default_factory=list)
    advice: str | None = None  # what to do, when not ok


def examine(db: Any, thresholds: Thresholds | None = None) -> tuple[Vitals, list[Unowned], list[Finding]]:
    """The vitals, what a migration would need, and the findings. Raises the
    driver's error when the role cannot run a query (is_database_error)."""
    vitals = read(db)
    missing = unowned(db)
    return vitals, missing, findings(vitals, missing, thresholds or THRESHOLDS)


def worst(found: list[Finding]) -> str:
    return max((f.verdict for f in found), key=_RANK.__getitem__, default=OK)


def findings(v: Vitals, missing: list[Unowned], t: Thresholds) -> list[Finding]:
    return [
        horizon(v, t),
        slots(v),
        dead_rows(v, t),
        size(v),
        vacuum(v, t),
        notify(v, t),
        xid_age(v, t),
        migrations(v, missing),
    ]


def holder_verdict(h: Holder, t: Thresholds) -> str:
    """A hold judged by how long (where known) and how far back."""
    by_time = _level(h.seconds, t.horizon_warning, t.horizon_bad)
    return max(by_time, _level(h.xids, t.horizon_xids_warning, t.horizon_xids_bad), key=_RANK.__getitem__)


def horizon(v: Vitals, t: Thresholds) -> Finding:
    holding = [h for h in v.holders if h.xids is not None]
    details = [held_text(h) for h in holding]
    if v.hidden:
        details.append(
            f"role {v.role} cannot see the query and start of {len(v.hidden)} of these (another role's:"
            f" '<insufficient privilege>'); a superuser can let it: GRANT pg_read_all_stats TO {v.role}"
        )
    if not holding:
        return Finding("horizon", OK, "nothing holds it: vacuum removes dead rows as soon as it runs", details)
    judged = sorted(holding, key=lambda h: (_RANK[holder_verdict(h, t)], h.xids or 0), reverse=True)
    first = judged[0]
    verdict = holder_verdict(first, t)
    summary = f"{first.label()}{_open_for(first)} holds it, xmin age {first.xids:,}"
    if verdict == OK:
        return Finding("horizon", OK, f"oldest: {summary}", details)
    advice = f"every finished job's dead rows stay until it ends; {first.remedy()}"
    return Finding("horizon", verdict, summary, details, advice)


def held_text(h: Holder) -> str:
    parts = [h.label()]
    if h.state:
        parts.append(h.state)
    if h.seconds is not None:
        parts.append(f"open {overview.age(h.seconds)}")
    elif not h.visible:
        parts.append("open for how long: not visible to this role")
    parts.append(f"xmin age {h.xids:,}")
    if h.query:
        parts.append(f"query: {one_line(h.query)}")
    return ", ".join(parts)


def slots(v: Vitals) -> Finding:
    found = [h for h in v.holders if h.kind == "slot"]
    if not found:
        return Finding("replication slots", OK, "none")
    details = [_slot_text(h) for h in found]
    idle = [h for h in found if not h.active]
    if not idle:
        return Finding("replication slots", OK, f"{len(found)}, each read by its consumer", details)
    summary = f"{len(idle)} of {len(found)} read by nothing: {', '.join(h.name or '?' for h in idle)}"
    advice = f"a slot nothing reads keeps its WAL, and any rows it holds, for ever: {idle[0].remedy()}"
    return Finding("replication slots", WARNING, summary, details, advice)


def _slot_text(h: Holder) -> str:
    state = f"active (pid {h.pid}{', ' + h.application if h.application else ''})" if h.active else "inactive"
    parts = [h.label(), state, f"keeps {_bytes(h.wal_bytes)} of WAL"]
    parts.append(f"xmin age {h.xids:,}" if h.xids is not None else "holds no rows (no xmin)")
    if h.catalog_xids is not None:
        parts.append(f"catalog_xmin age {h.catalog_xids:,}")
    return ", ".join(parts)


def dead_rows(v: Vitals, t: Thresholds) -> Finding:
    if not v.has_jobs:
        advice = "run worker.py migrate (the worker does at start)"
        return Finding("jobs dead rows", WARNING, "no jobs table", advice=advice)
    dead, live = v.dead_rows or 0, v.live_rows or 0
    share = dead / (dead + live) if dead + live else 0.0
    summary = f"{dead:,} dead, {live:,} live ({share:.0%} dead)"
    verdict = OK if dead < t.dead_rows_floor else _level(share, t.dead_share_warning, t.dead_share_bad)
    if verdict == OK:
        return Finding("jobs dead rows", OK, summary)
    held = v.horizon()
    if held is not None and holder_verdict(held, t) != OK:
        advice = f"they stay while {held.label()} holds the horizon (above); then vacuum removes them"
    else:
        advice = "autovacuum is behind: VACUUM (VERBOSE) jobs; on a busy table, lower its trigger with"
        advice += " ALTER TABLE jobs SET (autovacuum_vacuum_scale_factor = 0.01)"
    return Finding("jobs dead rows", verdict, summary, advice=advice)


def size(v: Vitals) -> Finding:
    if not v.has_jobs:
        return Finding("jobs size", OK, "no jobs table")
    summary = f"table {_bytes(v.table_bytes)}, {_bytes(v.total_bytes)} with its indexes and TOAST"
    indexes = sorted(v.indexes, key=lambda i: i[1] or 0, reverse=True)
    details = ["indexes: " + ", ".join(f"{name} {_bytes(n)}" for name, n in indexes)] if indexes else []
    return Finding("jobs size", OK, summary, [*details, *([v.sizes_note] if v.sizes_note else [])])


def vacuum(v: Vitals, t: Thresholds) -> Finding:
    if not v.has_jobs:
        return Finding("jobs vacuum", OK, "no jobs table")
    names = ("autovacuum", "vacuum", "autoanalyze")
    times = (v.last_autovacuum, v.last_vacuum, v.last_autoanalyze)
    summary = ", ".join(f"last {n} {_ago(w, v)}" for n, w in zip(names, times, strict=True))
    if v.autovacuum_off == "server":
        advice = "dead rows stay until someone runs VACUUM: turn it on (ALTER SYSTEM SET autovacuum = on;"
        advice += " SELECT pg_reload_conf()), or VACUUM jobs on a schedule"
        return Finding("jobs vacuum", WARNING, summary + "; autovacuum is off on the server", advice=advice)
    if v.autovacuum_off == "table":
        advice = "dead rows stay until someone runs VACUUM: ALTER TABLE jobs RESET (autovacuum_enabled)"
        return Finding("jobs vacuum", WARNING, summary + "; autovacuum is off for the jobs table", advice=advice)
    last = max((w for w in (v.last_autovacuum, v.last_vacuum) if w is not None), default=None)
    stale = last is None or v.now is None or (v.now - last).total_seconds() > t.vacuum_stale
    if (v.dead_rows or 0) < t.dead_rows_floor or not stale:
        return Finding("jobs vacuum", OK, summary)
    advice = "autovacuum does not reach the table: is it on (SHOW autovacuum), are its workers all busy"
    advice += " (pg_stat_progress_vacuum)? Run VACUUM (VERBOSE, ANALYZE) jobs meanwhile"
    return Finding("jobs vacuum", WARNING, summary, advice=advice)


def notify(v: Vitals, t: Thresholds) -> Finding:
    verdict = _level(v.notify_usage, t.notify_warning, t.notify_bad)
    summary = f"{v.notify_usage:.1%} of the NOTIFY queue in use"
    if verdict == OK:
        return Finding("notify queue", OK, summary)
    advice = "a session that LISTENs and does not read (left in a transaction) holds it; it fills, then every"
    advice += " enqueue's commit fails: find it among the horizon's holders and end it"
    return Finding("notify queue", verdict, summary, advice=advice)


def xid_age(v: Vitals, t: Thresholds) -> Finding:
    ages = [v.database_xid_age, *([v.jobs_xid_age] if v.jobs_xid_age is not None else [])]
    verdict = _level(max(ages), t.xid_age_warning, t.xid_age_bad)
    summary = f"database {v.database_xid_age:,} transactions"
    if v.jobs_xid_age is not None:
        summary += f", jobs table {v.jobs_xid_age:,}"
    if verdict == OK:
        return Finding("transaction-ID age", OK, summary)
    advice = "freezing is behind: end what holds the horizon, then VACUUM (FREEZE, VERBOSE) jobs, and the"
    advice += " other tables with the oldest relfrozenxid"
    return Finding("transaction-ID age", verdict, summary, advice=advice)


def migrations(v: Vitals, missing: list[Unowned]) -> Finding:
    if not missing:
        return Finding("migrations", OK, f"role {v.role} owns what the migrations change")
    details = [f"{u.kind} {u.name} is {u.owner}'s: {u.fix};" for u in missing]
    # Today's migrations need the schema's CREATE and what they change, not the database itself.
    verdict = WARNING if all(u.kind == "database" for u in missing) else BAD
    summary = f"role {v.role} cannot change {len(missing)} of what the migrations change or need"
    advice = "run the statements above as each object's owner or a superuser"
    if verdict == BAD:
        advice += "; until then an upgrade that changes them fails"
    return Finding("migrations", verdict, summary, details, advice)


def _level(value: float | None, warning: float, bad: float) -> str:
    if value is None:
        return OK
    return BAD if value > bad else WARNING if value > warning else OK


def _open_for(h: Holder) -> str:
    return f" open {overview.age(h.seconds)}" if h.seconds is not None else ""


def _ago(when: Any, v: Vitals) -> str:
    if when is None or v.now is None:
        return "never" if when is None else str(when)
    return f"{overview.age((v.now - when).total_seconds())} ago"


def _bytes(n: int | None) -> str:
    if n is None:
        return "?"
    if n < 1024:
        return f"{n:,} bytes"
    scaled, unit = n / 1024, "kB"
    for bigger in ("MB", "GB"):
        if scaled < 1024:
            break
        scaled, unit = scaled / 1024, bigger
    return f"{scaled:,.1f} {unit}"


# The command


def doctor(db: Any, args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    """The findings, for a person or as JSON; 1 when any is bad (warnings
    alone: 0), and 1 with one line when the role cannot read them."""
    try:
        vitals, missing, found = examine(db)
    except Exception as exc:
        if not is_database_error(exc):
            raise
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        print(f"doctor: could not read the database's state: {first}", file=err)
        return 1
    verdict = worst(found)
    if args.json:
        print_json(out, document(vitals, missing, found))
    else:
        print_findings(out, vitals, found)
    return 1 if verdict == BAD else 0


def document(vitals: Vitals, missing: list[Unowned], found: list[Finding]) -> dict[str, Any]:
    return {
        "verdict": worst(found),
        "findings": [asdict(f) for f in found],
        "vitals": asdict(vitals),
        "unowned": [asdict(u) for u in missing],
    }


def print_findings(out: IO[str], v: Vitals, found: list[Finding]) -> None:
    sees = "sees every session" if v.superuser or v.reads_all_stats else "sees its own role's sessions in full"
    who = "a superuser" if v.superuser else "not a superuser"
    print(f"database {v.database} as role {v.role} ({who}; {sees})\n", file=out)
    width = max(len(f.name) for f in found) + 2
    indent = " " * (9 + width)
    for f in found:
        print(f"{f.verdict:<9}{f.name:<{width}}{one_line(f.summary)}", file=out)
        for line in f.details:
            print(f"{indent}- {one_line(line)}", file=out)
        if f.advice:
            print(f"{indent}do: {one_line(f.advice)}", file=out)
