"""Claim time stays flat as finished rows pile up.

Run from the project root:  .venv/bin/python bench/claim_flat.py [--finished 1000000] [--claims 300]

On a fresh database of one server (DATABASE_URL, else the embedded one in
.pgdata/bench), twice: the jobs table holds a few hundred pending rows of one
queue, first alone, then next to --finished finished rows (status 'ok',
finished_at set, all of the same queue: the worst case for the claim), written
by one INSERT ... SELECT FROM generate_series and then ANALYZEd. Each time,
--claims claims run through the pool with the real job_claim named query (as
the poller sends it: prepared, autocommit), each followed by the job's
job_finalize, so the queue's one slot frees for the next claim. Only the claim
is timed.

Then, at the larger size, EXPLAIN (ANALYZE, BUFFERS) of the claim, inside a
transaction that is rolled back so nothing is claimed: once as the statement
text (a plan made for these values), once as the EXECUTE of the connection's
prepared statement (the plan the pool's claims actually ran, generic or not).
"""

# ruff: noqa: E402  (monkey-patching must come before every other import)
from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import argparse
import logging
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg2.errors
import psycopg2.extensions

# Run as a script, sys.path[0] is bench/; lib/ lives at the project root.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    ROOT,
    Scratch,
    context_lines,
    get_server,
    load_average,
    machine_line,
    percentile,
    run_record,
    save,
    scratch_database,
)
from lib.db import DB
from lib.insert import Job, insert_many
from lib.sql import STATEMENTS, Q

QUEUE = "flat"
NAME = "flat.Noop"
WORKER_ID = "bench-claim-flat"
LEASE = 30.0
# Untimed claims first: the connection prepares the statement and the caches warm.
WARMUP = 10
# Rolled-back EXPLAIN ANALYZE runs per size, for the server's own execution time.
EXPLAINS = 20
# One round trip per claim: a big fill must still be one statement, so it may take long.
FILL_SQL = """
INSERT INTO jobs (queue, name, args, status, run_at, created_at, started_at, finished_at, attempts, max_attempts)
SELECT %(queue)s, %(name)s, '{}'::jsonb, 'ok', t, t, t, t, 1, 1
FROM generate_series(1, %(rows)s) AS i,
     -- Spread over the retention period (14 days), newest last.
     LATERAL (SELECT now() - make_interval(secs => (%(rows)s - i) * 1209600.0 / %(rows)s) AS t) AS at
"""
_TIMING = re.compile(r"^(Planning|Execution) Time: ([\d.]+) ms$", re.M)
_COST = re.compile(r"cost=[\d.]+\.\.([\d.]+)")

log = logging.getLogger("bench")


@dataclass
class Spread:
    """Milliseconds."""

    mean: float
    p50: float
    p99: float
    max: float

    @classmethod
    def of(cls, ms: list[float]) -> Spread:
        return cls(sum(ms) / len(ms), percentile(ms, 50), percentile(ms, 99), max(ms))


@dataclass
class Phase:
    finished: int
    pending: int
    claims: int
    # The session's plan_cache_mode: "auto" is the server default, as the worker
    # runs; "force_generic_plan" is a diagnostic run that never replans.
    plan_mode: str = "auto"
    fill_s: float = 0.0  # the INSERT ... SELECT of the finished rows
    analyze_s: float = 0.0
    claim_ms: Spread | None = None  # client: pool checkout, round trip, execution, commit
    finalize_ms: Spread | None = None
    # Server: a rolled-back EXPLAIN ANALYZE of the prepared claim's EXECUTE, no commit.
    explain_execution_ms: Spread | None = None
    explain_planning_ms: Spread | None = None  # near 0 when the cached generic plan runs
    # How the pool's connection ran its prepared claim: generic or custom plans
    # (counted since the statement was prepared), and the planner's estimated
    # cost of each kind of plan, which decides between them in "auto" mode.
    generic_plans: int | None = None
    custom_plans: int | None = None
    generic_cost: float | None = None
    custom_cost: float | None = None
    table_mb: float = 0.0  # heap and indexes
    index_mb: dict[str, float] = field(default_factory=dict)
    claimed: int = 0  # jobs claimed and finalized by the timed claims


def claim_params() -> dict[str, Any]:
    # As Poller._claim_params builds them for slot 0 of a queue of one slot.
    return {"queue": QUEUE, "id": None, "slot": 0, "worker_id": WORKER_ID, "lease": LEASE, "max_attempts": 1}


def finalize_params(job_id: int, attempts: int) -> dict[str, Any]:
    # As Poller._write_outcome builds them for an "ok" outcome with no throttle.
    return {
        "id": job_id,
        "worker_id": WORKER_ID,
        "attempts": attempts,
        "status": "ok",
        "retry_in": None,
        "last_error": None,
        "delay": 0.0,
        "uncounted": 0,
        "last_traceback": None,
    }


def top_up(db: DB, pending: int) -> float:
    """pending more rows of the queue, and ANALYZE; the seconds the ANALYZE took."""
    insert_many(db, [Job(QUEUE, NAME, {"i": i}) for i in range(pending)])
    started = time.perf_counter()
    db.exec("ANALYZE jobs")
    return time.perf_counter() - started


def fill(db: DB, finished: int, pending: int) -> tuple[float, float]:
    """An empty table, then the finished rows and the pending ones; the seconds
    the fill and the ANALYZE took."""
    db.exec("TRUNCATE jobs, job_queues RESTART IDENTITY")
    started = time.perf_counter()
    if finished:
        db.exec(FILL_SQL, {"queue": QUEUE, "name": NAME, "rows": finished})
    filled = time.perf_counter()
    return filled - started, top_up(db, pending)


def claim_and_finalize(db: DB) -> tuple[float, float] | None:
    """One claim and the job's finalize: their milliseconds, or None when the
    claim found nothing."""
    started = time.perf_counter()
    row = db.query_row(Q.job_claim, claim_params())
    claimed = time.perf_counter()
    if row is None or row[0] is None:
        return None
    job_id, attempts = row[0], row[3]
    (written,) = db.query_row(Q.job_finalize, finalize_params(job_id, attempts)) or (0,)
    if written != 1:
        raise RuntimeError(f"job {job_id} was not finalized")
    return 1000 * (claimed - started), 1000 * (time.perf_counter() - claimed)


def explain(db: DB, prepared: bool) -> str:
    """EXPLAIN (ANALYZE, BUFFERS) of one claim in a transaction that is rolled
    back. prepared: of the EXECUTE of the statement the pool's connection
    prepared. Rolled back by hand, not by raising out of db.transaction(): the
    pool closes a connection left by an exception, and its prepared statements
    with it."""
    with db.connection() as conn:
        conn.autocommit = False
        try:
            with conn.cursor() as cur:
                return "\n".join(_explain(cur, prepared))
        finally:
            conn.rollback()


def _explain(cur: psycopg2.extensions.cursor, prepared: bool) -> list[str]:
    params = claim_params()
    if not prepared:
        # The statement text with the values in place: planned for them alone.
        cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + Q.job_claim, params)
        return [r[0] for r in cur.fetchall()]
    statement = STATEMENTS[Q.job_claim]
    cur.execute("SELECT count(*) FROM pg_prepared_statements WHERE name = %s", (statement.name,))
    if not cur.fetchone()[0]:
        return [f"(this connection has not prepared {statement.name})"]
    values = [params[name] for name in statement.params]
    cur.execute(cur.mogrify("EXPLAIN (ANALYZE, BUFFERS) " + statement.execute, values))
    return [r[0] for r in cur.fetchall()]


def plan_costs(db: DB) -> tuple[float, float]:
    """The planner's estimated total cost of the prepared claim as a generic
    plan and as a custom one (EXPLAIN without ANALYZE: nothing runs). In auto
    mode a prepared statement is planned anew for every execution while its
    generic plan is estimated to cost more than its custom plans."""
    statement = STATEMENTS[Q.job_claim]
    params = claim_params()
    values = [params[name] for name in statement.params]
    name = "bench_claim_costs"  # a statement of its own: the claim's plan counts stay as they are
    costs = []
    with db.connection() as conn, conn.cursor() as cur:
        cur.execute(statement.prepare.replace(statement.name, name, 1))
        try:
            for mode in ("force_generic_plan", "force_custom_plan"):
                conn.autocommit = False  # SET LOCAL: for this EXPLAIN only
                cur.execute(f"SET LOCAL plan_cache_mode = {mode}")
                cur.execute(cur.mogrify("EXPLAIN " + statement.execute.replace(statement.name, name, 1), values))
                costs.append(float(_COST.search(cur.fetchone()[0]).group(1)))  # type: ignore[union-attr]
                conn.rollback()
        finally:
            conn.rollback()
            conn.autocommit = True
            cur.execute(f"DEALLOCATE {name}")
    return costs[0], costs[1]


def timings(plan: str) -> tuple[float, float]:
    """Planning and Execution Time of an EXPLAIN ANALYZE, in ms."""
    found = dict((what, float(ms)) for what, ms in _TIMING.findall(plan))
    if set(found) != {"Planning", "Execution"}:
        raise RuntimeError(f"no planning and execution times in the plan:\n{plan}")
    return found["Planning"], found["Execution"]


def plans_used(db: DB) -> tuple[int | None, int | None]:
    """generic_plans, custom_plans of the prepared claim (PostgreSQL 14 and later)."""
    name = STATEMENTS[Q.job_claim].name
    try:
        row = db.query_row("SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = %s", (name,))
    except psycopg2.errors.UndefinedColumn:
        return None, None
    return (row[0], row[1]) if row else (None, None)


def sizes(db: DB) -> tuple[float, dict[str, float]]:
    mb = 1024 * 1024
    total = db.query_row("SELECT pg_total_relation_size('jobs')")[0] / mb
    rows = db.query(
        "SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) FROM pg_index "
        "WHERE indrelid = 'jobs'::regclass ORDER BY 1"
    )
    return total, {name: size / mb for name, size in rows}


def run_phase(db: DB, finished: int, args: argparse.Namespace, plan_mode: str = "auto") -> Phase:
    """Time the claims. In auto mode on a fresh table of finished + pending
    rows; otherwise on the table as it is, topped up with pending rows, with
    the session's plan_cache_mode set for the phase."""
    phase = Phase(finished, args.pending, args.claims, plan_mode)
    if plan_mode == "auto":
        phase.fill_s, phase.analyze_s = fill(db, finished, args.pending)
    else:
        phase.analyze_s = top_up(db, args.pending)
        # The pool has one connection, so this holds for every claim until the
        # RESET; a prepared statement reads the setting at each execution.
        db.exec(f"SET plan_cache_mode = {plan_mode}")
    generic_before, custom_before = plans_used(db)
    for _ in range(WARMUP):
        claim_and_finalize(db)
    claims, finalizes = [], []
    for _ in range(args.claims):
        timed = claim_and_finalize(db)
        if timed is None:
            raise RuntimeError("a claim found no pending row: raise --pending")
        claims.append(timed[0])
        finalizes.append(timed[1])
    phase.claimed = len(claims)
    phase.claim_ms, phase.finalize_ms = Spread.of(claims), Spread.of(finalizes)
    generic_after, custom_after = plans_used(db)
    if generic_after is not None and custom_after is not None:
        # This phase's claims only (warm-up included): the counts run from the PREPARE.
        phase.generic_plans = generic_after - (generic_before or 0)
        phase.custom_plans = custom_after - (custom_before or 0)
    planned, executed = zip(*(timings(explain(db, prepared=True)) for _ in range(EXPLAINS)), strict=True)
    phase.explain_planning_ms, phase.explain_execution_ms = Spread.of(list(planned)), Spread.of(list(executed))
    phase.table_mb, phase.index_mb = sizes(db)
    phase.generic_cost, phase.custom_cost = plan_costs(db)
    if plan_mode != "auto":
        db.exec("RESET plan_cache_mode")
    return phase


def measure(scratch: Scratch, args: argparse.Namespace) -> tuple[list[Phase], dict[str, str]]:
    # One connection: every claim, finalize and EXPLAIN runs on the session
    # that prepared the claim, so the EXPLAIN of its EXECUTE shows the plan the
    # claims used.
    db = DB.connect(scratch.url, size=1, application_name="jobs-bench")
    try:
        phases = []
        for finished in (0, args.finished):
            print(f"{finished} finished rows, {args.pending} pending: {args.claims} claims ...", flush=True)
            phases.append(run_phase(db, finished, args))
        if args.generic:
            print(f"{args.finished} finished rows, plan_cache_mode = force_generic_plan (diagnostic) ...", flush=True)
            phases.append(run_phase(db, args.finished, args, "force_generic_plan"))
        plans = {"statement": explain(db, prepared=False), "prepared": explain(db, prepared=True)}
        left = db.query_row("SELECT count(*) FROM jobs WHERE status = 'started'")[0]
        if left:
            raise RuntimeError(f"{left} rows were left started: the EXPLAIN was not rolled back")
    finally:
        db.close()
    return phases, plans


# ---------------------------------------------------------------- report


def report(
    scratch: Scratch, phases: list[Phase], plans: dict[str, str], args: argparse.Namespace, load: float
) -> dict[str, Any]:
    first, big = phases[0], phases[1]
    ratio = big.claim_ms.p50 / first.claim_ms.p50 if first.claim_ms and big.claim_ms else None
    return {
        **run_record(scratch.server, load),
        "options": {
            "finished": args.finished,
            "pending": args.pending,
            "claims": args.claims,
            "warmup": WARMUP,
            "explains": EXPLAINS,
            "generic_diagnostic": args.generic,
        },
        "phases": [asdict(p) for p in phases],
        "p50_ratio": ratio,  # claim p50 with the finished rows over without, plan_cache_mode auto
        "explain": plans,
    }


def _spread(s: dict[str, float] | None) -> str:
    if s is None:
        return f"{'n/a':>9}" * 4
    return "".join(f"{s[k]:>9.3f}" for k in ("mean", "p50", "p99", "max"))


def _label(p: dict[str, Any]) -> str:
    return f"{p['finished']}" + ("" if p["plan_mode"] == "auto" else " generic*")


def print_table(result: dict[str, Any]) -> None:
    print()
    print("\n".join(context_lines(result)))
    print(machine_line(result))
    options = result["options"]
    print(
        f"\n{options['claims']} timed claims (after {options['warmup']} untimed), each followed by its finalize;"
        f" {options['pending']} pending rows of the queue"
    )
    print(f"{'finished rows':>17}  {'ms':<24}{'mean':>9}{'p50':>9}{'p99':>9}{'max':>9}")
    for p in result["phases"]:
        print(f"{_label(p):>17}  {'claim (client)':<24}{_spread(p['claim_ms'])}")
        print(f"{'':>17}  {'finalize (client)':<24}{_spread(p['finalize_ms'])}")
        print(f"{'':>17}  {'claim planning (srv)':<24}{_spread(p['explain_planning_ms'])}")
        print(f"{'':>17}  {'claim execution (srv)':<24}{_spread(p['explain_execution_ms'])}")
    print("(client: pool checkout, round trip, planning, execution and commit; srv: Planning and Execution Time")
    print(f" of a rolled-back EXPLAIN ANALYZE of the prepared claim's EXECUTE, {options['explains']} runs, no commit)")
    if any(p["plan_mode"] != "auto" for p in result["phases"]):
        print("(* diagnostic: plan_cache_mode = force_generic_plan on the session; the worker runs the default, auto)")
    print()
    for p in result["phases"]:
        indexes = ", ".join(f"{k} {v:.1f}" for k, v in p["index_mb"].items() if v >= 0.05)
        print(
            f"{_label(p):>17}: fill {p['fill_s']:.1f} s, analyze {p['analyze_s']:.1f} s;"
            f" jobs {p['table_mb']:.1f} MB with indexes ({indexes or 'all under 0.1 MB'})"
        )
        print(
            f"{'':>17}  prepared claim ran {p['generic_plans']} generic, {p['custom_plans']} custom plans;"
            f" estimated cost generic {p['generic_cost']:.1f}, custom {p['custom_cost']:.1f}"
        )
    rows = result["phases"][1]["finished"]
    if result["p50_ratio"] is not None:
        print(f"\nclaim p50 at {rows} finished rows over p50 at 0: {result['p50_ratio']:.2f}")
    print(f"\nEXPLAIN (ANALYZE, BUFFERS) of the claim's statement text at {rows} finished rows (rolled back):")
    print(result["explain"]["statement"])
    tail = [line for line in result["explain"]["prepared"].splitlines() if line.endswith(" ms")]
    print(f"EXECUTE of the pool's prepared claim, the same way: {'; '.join(tail)} (whole plan in the JSON)")


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--finished", type=int, default=1_000_000, help="finished rows of the big phase")
    parser.add_argument("--claims", type=int, default=300, help="timed claims per phase (default %(default)s)")
    parser.add_argument("--pending", type=int, default=400, help="pending rows per phase (default %(default)s)")
    parser.add_argument(
        "--no-generic",
        dest="generic",
        action="store_false",
        help="skip the diagnostic phase: the big table again with plan_cache_mode = force_generic_plan",
    )
    args = parser.parse_args(argv)
    if args.finished < 1 or args.claims < 1 or args.pending < args.claims + WARMUP:
        parser.error(f"--finished and --claims >= 1, --pending >= --claims + {WARMUP}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    load_at_start = load_average()
    server = get_server()
    with scratch_database(server) as scratch:
        print(f"PostgreSQL {server.version} ({server.source}), bench database {scratch.name}", flush=True)
        phases, plans = measure(scratch, args)
        result = report(scratch, phases, plans, args, load_at_start)
    print_table(result)
    print(f"\nsaved {save(result, 'claim_flat').relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
