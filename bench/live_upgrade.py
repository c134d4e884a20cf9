"""Upgrading a live database: how long an application's inserts wait, and
whether any job is lost, while the migrations run beside a legacy writer.

Run from the project root:  .venv/bin/python bench/live_upgrade.py [--finished 2000000] [--pending 1000]

Each case in a database of its own, owned by a role made for it that is no
superuser (as a managed Postgres gives its user); the migrations, the writer
and the checks run as that role:

  original  the original service's table (sql/migrations/001_jobs.sql, the
            shape tests/db/test_migrate.py upgrades) with --finished finished
            rows (ok, a twentieth err, over 30 days and 40 queues) and
            --pending pending ones, written with INSERT ... SELECT
            generate_series; upgraded through every migration and the rules;
  at-034    the schema at migration 034 (tests/data/schema_at_034.sql, a
            pg_dump), restored by the server's superuser and its tables and
            functions then given to the owner, as tests/db/test_schema.py
            does, with the same rows; upgraded to today's (the rules).

After the fill: VACUUM ANALYZE and a CHECKPOINT, so the upgrade meets the
table as a long-lived one is, not the fill's dirty pages. Then the legacy
writer (bench/apps/sharing_enqueue.py legacy: the original Go service's
INSERT ... ON CONFLICT DO NOTHING RETURNING id in autocommit, prepared once as
pgx does) writes one job every --every seconds (10 ms): --window seconds
before, the upgrade (lib.store.migrate.migrate on a pool of the owner, as
`worker.py migrate` runs it), --window seconds after. For each case: how long
the upgrade took, the writes during it, their p99 and longest wait against
the writer's own p99 before it, the errors (a failed insert is a lost job),
and whether every pending row, the old ones and each one the writer was
given an id for, is still pending afterwards. The target: no insert waits
more than 1 s, nothing lost. Under the table, the steps of the upgrade that
took longest, with the longest wait of an insert begun during each.
"""

from __future__ import annotations

import argparse
import logging
import secrets
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness
from bench.harness import ROOT, CommitRate, Server, add_pgbench_seconds, admin_connect, describe, with_database
from bench.sharing import Writes, latency_ms, start_clients
from lib.store.db import DB
from lib.store.migrate import migrate
from lib.store.sql import MIGRATIONS_DIR

CASES = {"original": "the original table", "at-034": "at migration 034"}
AT_034 = ROOT / "tests" / "data" / "schema_at_034.sql"
LEGACY_QUEUE = "legacy"
TARGET_MS = 1000.0
# Steps of the upgrade shown under the table: the slowest, and any an insert waited over the target in.
SLOWEST_STEPS = 5

# Finished rows as the old service left them; one in twenty an error.
FILL_FINISHED = """
INSERT INTO jobs (queue, name, args, status, callsite, created_at, started_at, finished_at)
SELECT 'q' || lpad(mod(g, 40)::text, 2, '0'), 'legacy.Job', jsonb_build_object('n', g),
       CASE WHEN mod(g, 20) = 0 THEN 'err: upstream said no' ELSE 'ok' END, 'legacy/jobs.go:42',
       t, t + interval '1 second', t + interval '2 seconds'
FROM generate_series(1, %(n)s) g, LATERAL (SELECT now() - interval '30 days' * g / %(n)s AS t) at
"""
FILL_PENDING = """
INSERT INTO jobs (queue, name, args, callsite)
SELECT 'q' || lpad(mod(g, 40)::text, 2, '0'), 'legacy.Job', jsonb_build_object('pending', g), 'legacy/jobs.go:42'
FROM generate_series(1, %(n)s) g
"""
# At 034 the same rows name what the later columns hold for them.
FILL_FINISHED_034 = """
INSERT INTO jobs (queue, name, args, status, callsite, created_at, started_at, finished_at, run_at, attempts,
                  max_attempts, dedupe)
SELECT 'q' || lpad(mod(g, 40)::text, 2, '0'), 'legacy.Job', jsonb_build_object('n', g),
       CASE WHEN mod(g, 20) = 0 THEN 'err: upstream said no' ELSE 'ok' END, 'legacy/jobs.go:42',
       t, t + interval '1 second', t + interval '2 seconds', t, 1, 1, false
FROM generate_series(1, %(n)s) g, LATERAL (SELECT now() - interval '30 days' * g / %(n)s AS t) at
"""
# What tests/db/test_schema.py's as_administrator gives the database's owner after a restore.
GIVE_TO_OWNER = """
DO $$ DECLARE r record; owner text := (SELECT datdba::regrole::text FROM pg_database
  WHERE datname = current_database()); BEGIN
  FOR r IN SELECT oid::regprocedure AS f FROM pg_proc WHERE pronamespace = 'public'::regnamespace LOOP
    EXECUTE format('ALTER FUNCTION %s OWNER TO %I', r.f, owner); END LOOP;
  FOR r IN SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relkind = 'r' LOOP
    EXECUTE format('ALTER TABLE %I OWNER TO %I', r.relname, owner); END LOOP; END $$
"""


@dataclass
class Owned:
    superuser_url: str  # the database as the server's superuser
    url: str  # the database as its owner


def as_role(url: str, user: str, password: str) -> str:
    if "://" not in url:  # a keyword DSN: later keywords win
        return f"{url} user={user} password={password}"
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{host}"))


@contextmanager
def owned_database(server: Server) -> Iterator[Owned]:
    """A database and a role of its own that owns it and is no superuser,
    both dropped at the end however the benchmark ends."""
    admin = admin_connect(server.url)
    name = f"jobs_bench_{uuid.uuid4().hex[:10]}"
    password = secrets.token_hex(16)
    try:
        describe(admin, server)
        with admin.cursor() as cur:
            cur.execute(f"CREATE ROLE {name} LOGIN PASSWORD %s NOSUPERUSER NOCREATEDB NOCREATEROLE", (password,))
            cur.execute(f"CREATE DATABASE {name} OWNER {name}")
            cur.execute(f"REVOKE ALL ON DATABASE {name} FROM PUBLIC")
        try:
            url = with_database(server.url, name)
            yield Owned(url, as_role(url, name, password))
        finally:
            with admin.cursor() as cur:
                cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
                cur.execute(f"DROP ROLE IF EXISTS {name}")
    finally:
        admin.close()


def run_sql(url: str, *statements: tuple[str, dict[str, Any] | None]) -> None:
    conn = admin_connect(url)
    try:
        with conn.cursor() as cur:
            for sql, params in statements:
                cur.execute(sql, params)
    finally:
        conn.close()


def fill(case: str, db: Owned, finished: int, pending: int) -> None:
    if case == "original":
        run_sql(
            db.url,
            ((MIGRATIONS_DIR / "001_jobs.sql").read_text(), None),
            (FILL_FINISHED, {"n": finished}),
            (FILL_PENDING, {"n": pending}),
        )
    else:
        run_sql(db.superuser_url, (AT_034.read_text(), None), (GIVE_TO_OWNER, None))
        run_sql(db.url, (FILL_FINISHED_034, {"n": finished}), (FILL_PENDING, {"n": pending}))
    run_sql(db.url, ("VACUUM ANALYZE", None))
    run_sql(db.superuser_url, ("CHECKPOINT", None))


class Steps(logging.Handler):
    """What the upgrade logs (each migration applied, the rules, each wait
    for a lock), with the time of each line."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((time.time(), record.getMessage()))


def upgrade(url: str) -> tuple[float, float, list[tuple[float, str]]]:
    """migrate() as a worker runs it, on a pool of the owner; (began, ended, the lines it logged)."""
    logger = logging.getLogger("jobs.migrate")
    steps = Steps()
    level, propagate = logger.level, logger.propagate
    logger.addHandler(steps)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    db = DB.connect(url, size=2)
    try:
        began = time.time()
        migrate(db)
        ended = time.time()
    finally:
        db.close()
        logger.removeHandler(steps)
        logger.setLevel(level)
        logger.propagate = propagate
    return began, ended, steps.lines


def step_waits(writes: Writes, began: float, lines: list[tuple[float, str]]) -> list[dict[str, Any]]:
    """Each logged step of the upgrade (from the line before it to its own),
    with the longest wait of an insert begun in it."""
    steps, start = [], began
    for at, text in lines:
        waits = [t for b, t in zip(writes.began, writes.took, strict=True) if start <= b < at]
        steps.append({"step": text, "seconds": at - start, "longest_ms": 1000 * max(waits, default=0.0)})
        start = at
    return steps


def pending_kept(db: Owned, pending: int, writes: Writes) -> dict[str, Any]:
    """Whether the seeded pending rows and every row the writer was given an id for are still pending."""
    ids = [i for i in writes.ids if i]
    conn = admin_connect(db.url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM jobs WHERE status = 'pending' AND queue <> %s", (LEGACY_QUEUE,))
            old = cur.fetchone()[0]
            cur.execute("SELECT count(*) FROM jobs WHERE status = 'pending' AND id = ANY(%s)", (ids,))
            new = cur.fetchone()[0]
    finally:
        conn.close()
    return {"old": old, "old_expected": pending, "new": new, "new_expected": len(ids)}


def one_case(server: Server, case: str, args: argparse.Namespace) -> dict[str, Any]:
    with owned_database(server) as db:
        print(f"{CASES[case]}: {args.finished:,} finished and {args.pending:,} pending rows ...", flush=True)
        began = time.monotonic()
        fill(case, db, args.finished, args.pending)
        print(f"  filled in {time.monotonic() - began:.0f} s; the writer, then the upgrade ...", flush=True)
        writer = start_clients("legacy", db.url, 1, [LEGACY_QUEUE], every=args.every)
        time.sleep(writer.start_at - time.time() + args.window)
        up_began, up_ended, lines = upgrade(db.url)
        time.sleep(args.window)
        writes = writer.stop()
        kept = pending_kept(db, args.pending, writes)
    phases = {
        "before": (writer.start_at, up_began),
        "during": (up_began, up_ended),
        "after": (up_ended, float("inf")),
    }
    by_phase = {}
    for phase, (start, end) in phases.items():
        took = [t for b, t in zip(writes.began, writes.took, strict=True) if start <= b < end]
        # A write begun before the upgrade and still waiting when it began waited on it too.
        if phase == "during":
            took += [t for b, t in zip(writes.began, writes.took, strict=True) if b < start < b + t]
        by_phase[phase] = {"writes": len(took), **latency_ms(took)}
    steps = step_waits(writes, up_began, lines)
    print(f"  upgraded in {up_ended - up_began:.1f} s; longest insert wait {by_phase['during']['max'] or 0:,.0f} ms")
    return {
        "case": case,
        "upgrade_seconds": up_ended - up_began,
        "phases": by_phase,
        "writes": len(writes.took),
        "errors": writes.errors,
        # No id and no error: the conflict clause wrote nothing (no unique index should match).
        "suppressed": sum(1 for i in writes.ids if i is None) - len(writes.errors),
        "upgrade_began": up_began,
        "kept": kept,
        "steps": steps,
    }


def print_table(result: dict[str, Any]) -> None:
    options = result["options"]
    print(
        f"rows         {options['finished']:,} finished and {options['pending']:,} pending; the legacy writer one"
        f" insert every {1000 * options['every']:g} ms, {options['window']:g} s before and after the upgrade"
    )
    print()
    header = (
        f"{'case':<20}{'upgrade s':>10}{'writes':>8}{'p99 ms':>9}{'longest ms':>12}{'x target':>10}"
        f"{'p99 before':>11}{'errors':>8}{'old pending':>14}{'new pending':>14}"
    )
    print(header)
    print("-" * len(header))
    for case in result["cases"]:
        during, before = case["phases"]["during"], case["phases"]["before"]
        kept = case["kept"]
        longest = during["max"] or 0.0
        print(
            f"{CASES[case['case']]:<20}{case['upgrade_seconds']:>10.1f}{during['writes']:>8,}{_ms(during['p99']):>9}"
            f"{longest:>12,.0f}{longest / TARGET_MS:>10.2f}{_ms(before['p99']):>11}{len(case['errors']):>8}"
            f"{kept['old']:>7,}/{kept['old_expected']:<6,}{kept['new']:>7,}/{kept['new_expected']:<6,}"
        )
    print(f"(x target: the longest wait over {TARGET_MS:,.0f} ms; p99 before: the writer's own, before the upgrade;")
    print(" pending: still pending afterwards / seeded, and of the writer's inserts that were given an id)")
    for case in result["cases"]:
        print()
        print(f"{CASES[case['case']]}: the upgrade's slowest steps (each ends with its log line)")
        slow = sorted(case["steps"], key=lambda s: -s["seconds"])
        shown = slow[:SLOWEST_STEPS] + [s for s in slow[SLOWEST_STEPS:] if s["longest_ms"] > TARGET_MS]
        for step in shown:
            print(f"  {step['seconds']:>8.2f} s  longest insert {step['longest_ms']:>9,.0f} ms  {step['step'][:90]}")
        for at, code, message in case["errors"][:5]:
            first_line = message.splitlines()[0][:90]
            print(f"  error {at - case['upgrade_began']:+.1f} s into the upgrade: {code} {first_line}")
        if len(case["errors"]) > 5:
            print(f"  ... {len(case['errors']) - 5} more errors")
    print()
    for case in result["cases"]:
        longest = case["phases"]["during"]["max"] or 0.0
        kept = case["kept"]
        lost = len(case["errors"]) + (kept["old_expected"] - kept["old"]) + (kept["new_expected"] - kept["new"])
        met = "met" if longest <= TARGET_MS and lost == 0 else "NOT met"
        print(
            f"{CASES[case['case']]}: upgrade {case['upgrade_seconds']:.1f} s, longest insert wait {longest:,.0f} ms,"
            f" {lost} jobs lost (target: no wait over {TARGET_MS:,.0f} ms, nothing lost: {met})"
        )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="original,at-034", help="of original, at-034 (default %(default)s)")
    parser.add_argument("--finished", type=int, default=2_000_000, help="finished rows (default %(default)s)")
    parser.add_argument("--pending", type=int, default=1000, help="pending rows (default %(default)s)")
    parser.add_argument("--every", type=float, default=0.01, help="seconds between inserts (default %(default)s)")
    parser.add_argument("--window", type=float, default=3.0, help="seconds before and after (default %(default)s)")
    add_pgbench_seconds(parser, default=5)
    args = parser.parse_args(argv)
    args.cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    if set(args.cases) - set(CASES) or args.finished < 0 or args.pending < 0 or args.every <= 0:
        parser.error("--cases of original, at-034; --finished, --pending >= 0; --every > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def measure(server: Server, rate: CommitRate) -> dict[str, Any]:
        return {"cases": [one_case(server, case, args) for case in args.cases]}

    return harness.run("live_upgrade", args, measure, print_table)


if __name__ == "__main__":
    sys.exit(main())
