"""Claim cost stays flat as finished and pending rows pile up.

Run from the project root:  .venv/bin/python bench/claim_flat.py [--finished 1000000] [--backlog 100000]

Two fresh databases of one server (DATABASE_URL, else the embedded one in
.pgdata/bench), migrated alike:

  (a) the jobs table holds only the measured queue's --pending pending rows;
  (b) the same rows next to --finished finished rows (status 'ok', all of the
      measured queue: the worst case for the claim) and --backlog more pending
      rows spread as a deployment has them: a few thousand on the measured
      queue (--queue-due due, --queue-delayed delayed into the future), the
      rest over --other-queues other queues, a fifth of them delayed. Written
      by INSERT ... SELECT FROM generate_series. Both: VACUUM ANALYZE, CHECKPOINT.

On both, the worker's own writes through lib/run/steps.py's group commit (the
job_step_one named query, prepared, autocommit), in rounds, alternating job by
job between (a) and (b) so the machine's load falls on both alike: a claim
alone and the job's outcome alone, then the steady state of a busy one-slot
queue, the outcome sent together with the next claim. The headline is the p50 of that
last one at (b) over (a): the target is at most 1.2.

Then, on each, the server's side: rolled-back EXPLAIN (ANALYZE, BUFFERS) of the
job_claim and job_step_one (an outcome alone) named queries (execution time, and the buffers the
function's statements touched, which the Function Scan's count includes), and,
where the server has auto_explain, the plans of the statements inside
jobs_step_one (generic, as the function runs them), to show
each stays on its index.
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
from collections import deque
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.errors
import psycopg2.extensions

# Run as a script, sys.path[0] is bench/; lib/ lives at the project root.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness
from bench.harness import (
    CommitRate,
    Scratch,
    Server,
    add_pgbench_seconds,
    admin_connect,
    percentile,
    scratch_database,
)
from lib.insert import Job, insert_many
from lib.run.steps import Ask, Committer, Reply, lone_step
from lib.store.db import DB
from lib.store.sql import Q

QUEUE = "flat"
NAME = "flat.Noop"
WORKER_ID = "bench-claim-flat"
LEASE = 30.0
# Untimed jobs first: the connections prepare their statements and the caches warm.
WARMUP = 10
# Timed jobs of each kind in a round (see time_sends).
ROUND = 30
# Rolled-back EXPLAIN ANALYZE runs per table, for the server's own execution time.
EXPLAINS = 20
# The issue's target: claim cost at (b) at most this many times that at (a).
TARGET = 1.2
# One round trip per fill: a big fill must still be one statement, so it may take long.
FINISHED_SQL = """
INSERT INTO jobs (queue, name, args, status, run_at, created_at, started_at, finished_at, attempts, max_attempts)
SELECT %(queue)s, %(name)s, '{}'::jsonb, 'ok', t, t, t, t, 1, 1
FROM generate_series(1, %(rows)s) AS i,
     -- Spread over the retention period (14 days), newest last.
     LATERAL (SELECT now() - make_interval(secs => (%(rows)s - i) * 1209600.0 / %(rows)s) AS t) AS at
"""
# Pending rows, round robin over the queues given, at priority 0 (lib.insert's
# default). Due: enqueued over the hour before now, so the claims reach them
# before the rows of (a). Delayed (retries, scheduled jobs): from 10 minutes to
# a day ahead, past the end of the run.
PENDING_SQL = """
INSERT INTO jobs (queue, name, args, run_at, created_at)
SELECT (%(queues)s::text[])[1 + i %% cardinality(%(queues)s::text[])], %(name)s, jsonb_build_object('i', i),
       t, least(t, now())
FROM generate_series(1, %(rows)s) AS i,
     LATERAL (SELECT CASE WHEN %(delayed)s THEN now() + make_interval(secs => 600 + 86400.0 * i / %(rows)s)
                          ELSE now() - make_interval(secs => 3600.0 * (%(rows)s - i) / %(rows)s) END AS t) AS at
"""
# One in this many pending rows of the other queues is delayed.
OTHER_DELAYED_EVERY = 5
_TIMING = re.compile(r"^(Planning|Execution) Time: ([\d.]+) ms$", re.M)
_BUFFERS = re.compile(r"Buffers: shared ([^\n]*)")
_SCAN = re.compile(
    r"((?:Seq Scan|Index Scan|Index Only Scan|Bitmap Index Scan|Bitmap Heap Scan)(?: Backward)?(?: using \S+)? on \S+)"
)

log = logging.getLogger("bench")


@dataclass
class Spread:
    """Milliseconds (or buffers)."""

    mean: float
    p50: float
    p99: float
    max: float

    @classmethod
    def of(cls, ms: list[float]) -> Spread:
        return cls(sum(ms) / len(ms), percentile(ms, 50), percentile(ms, 99), max(ms))


@dataclass
class Backlog:
    """The pending rows (b) holds beyond those of (a)."""

    queue_due: int = 0
    queue_delayed: int = 0
    other_queues: int = 0
    other_due: int = 0
    other_delayed: int = 0

    @property
    def rows(self) -> int:
        return self.queue_due + self.queue_delayed + self.other_due + self.other_delayed


@dataclass
class Phase:
    label: str  # "a" or "b"
    finished: int
    pending: int  # the measured queue's pending rows, in both tables
    backlog: Backlog
    fill_s: float = 0.0  # the INSERT ... SELECTs
    vacuum_s: float = 0.0  # VACUUM ANALYZE
    checkpoint: bool = False  # a CHECKPOINT after the fill (not without the privilege)
    rows: dict[str, int] = field(default_factory=dict)  # by status, once filled
    # Client: the group commit's send as a poller calls it (one job_step_one round trip and commit).
    step_ms: Spread | None = None  # outcome and the next claim together: a busy queue's steady state
    claim_ms: Spread | None = None  # a claim alone
    outcome_ms: Spread | None = None  # an outcome alone
    # Server: rolled-back EXPLAIN (ANALYZE, BUFFERS) of job_claim / job_step_one (an outcome alone), no commit.
    claim_exec_ms: Spread | None = None
    finalize_exec_ms: Spread | None = None
    claim_buffers: Spread | None = None  # shared buffers hit + read, the function's statements included
    finalize_buffers: Spread | None = None
    table_mb: float = 0.0  # heap and indexes
    index_mb: dict[str, float] = field(default_factory=dict)
    claimed: int = 0  # jobs claimed and finalized by the timed sends


@dataclass
class Side:
    """One of the two tables, with the pool and group commit the claims go through."""

    phase: Phase
    db: DB
    commit: Committer
    held: tuple[int, int] | None = None  # (id, attempts) of the job claimed and not yet finalized
    steps: list[float] = field(default_factory=list)
    claims: list[float] = field(default_factory=list)
    outcomes: list[float] = field(default_factory=list)


def claim_params() -> dict[str, Any]:
    # As Claimer.params builds them for slot 0 of a queue of one slot.
    return {"queue": QUEUE, "id": None, "slot": 0, "worker_id": WORKER_ID, "lease": LEASE, "max_attempts": 1}


def finalize_params(job_id: int, attempts: int) -> dict[str, Any]:
    # As Writer.outcome_params builds them for an "ok" outcome with no throttle.
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


# ---------------------------------------------------------------- the tables


def top_up(db: DB, pending: int) -> None:
    """pending more rows of the queue, due now, as lib.insert writes them."""
    insert_many(db, [Job(QUEUE, NAME, {"i": i}) for i in range(pending)])


def fill_backlog(db: DB, backlog: Backlog, others: list[str]) -> None:
    """The backlog's pending rows: due and delayed, of the measured queue and of the others."""
    for queues, rows, delayed in (
        ([QUEUE], backlog.queue_due, False),
        ([QUEUE], backlog.queue_delayed, True),
        (others, backlog.other_due, False),
        (others, backlog.other_delayed, True),
    ):
        if rows:
            db.exec(PENDING_SQL, {"queues": queues, "name": NAME, "rows": rows, "delayed": delayed})


def fill(db: DB, phase: Phase) -> None:
    """The finished rows, the backlog and the queue's pending rows; then VACUUM ANALYZE."""
    started = time.perf_counter()
    if phase.finished:
        db.exec(FINISHED_SQL, {"queue": QUEUE, "name": NAME, "rows": phase.finished})
    fill_backlog(db, phase.backlog, [f"q{n:02d}" for n in range(phase.backlog.other_queues)])
    top_up(db, phase.pending)
    filled = time.perf_counter()
    db.exec("VACUUM ANALYZE jobs, job_queues")
    phase.fill_s, phase.vacuum_s = filled - started, time.perf_counter() - filled
    phase.checkpoint = checkpoint(db)
    phase.rows = dict(db.query("SELECT status, count(*) FROM jobs GROUP BY status ORDER BY status"))
    phase.rows["due on the queue"] = db.query_row(
        "SELECT count(*) FROM jobs WHERE queue = %s AND status = 'pending' AND run_at <= now()", (QUEUE,)
    )[0]


def checkpoint(db: DB) -> bool:
    """Write the fill's dirty pages now, not while the claims are timed (the
    commits' WAL flushes would wait behind them). Whether it could (a
    superuser or pg_checkpoint may)."""
    try:
        db.exec("CHECKPOINT")
    except psycopg2.errors.InsufficientPrivilege:
        return False
    return True


def sizes(db: DB) -> tuple[float, dict[str, float]]:
    mb = 1024 * 1024
    total = db.query_row("SELECT pg_total_relation_size('jobs')")[0] / mb
    rows = db.query(
        "SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) FROM pg_index "
        "WHERE indrelid = 'jobs'::regclass ORDER BY 1"
    )
    return total, {name: size / mb for name, size in rows}


# ---------------------------------------------------------------- the client's side


def send(side: Side, outcome: dict[str, Any] | None, claim: dict[str, Any] | None) -> tuple[float, Reply]:
    """One ask of the group commit, as a poller makes it: its milliseconds and reply."""
    started = time.perf_counter()
    reply = side.commit.send(outcome, claim)
    return 1000 * (time.perf_counter() - started), reply


def claimed(reply: Reply) -> tuple[int, int]:
    row = reply.row
    if row is None or row[0] is None:
        raise RuntimeError("a claim found no due row: raise --pending")
    return row[0], row[3]


def written(reply: Reply, job: tuple[int, int]) -> None:
    if not reply.written:
        raise RuntimeError(f"job {job[0]} was not finalized")


def apart(side: Side) -> tuple[float, float]:
    """A claim alone, then the job's outcome alone (what a poller sends after a
    wake, and a stopping one): their milliseconds."""
    claim_ms, reply = send(side, None, claim_params())
    job = claimed(reply)
    outcome_ms, reply = send(side, finalize_params(*job), None)
    written(reply, job)
    return claim_ms, outcome_ms


def step(side: Side) -> float:
    """The held job's outcome with the next claim, in one job_step_one (what a
    busy one-slot queue sends per job): its milliseconds."""
    assert side.held is not None
    ms, reply = send(side, finalize_params(*side.held), claim_params())
    written(reply, side.held)
    side.held = claimed(reply)
    return ms


def in_turn(sides: list[Side], i: int) -> list[Side]:
    """Alternate which table goes first, so neither always follows the other."""
    return sides if i % 2 == 0 else sides[::-1]


def time_sends(sides: list[Side], claims: int) -> None:
    """Rounds of ROUND jobs: claims and outcomes alone, then outcomes with the
    next claim, so each kind spreads over the whole run; an untimed round first."""
    rounds = [WARMUP] + [min(ROUND, claims - done) for done in range(0, claims, ROUND)]
    for r, n in enumerate(rounds):
        for i in range(n):
            for side in in_turn(sides, i):
                claim_ms, outcome_ms = apart(side)
                if r:
                    side.claims.append(claim_ms)
                    side.outcomes.append(outcome_ms)
        for side in sides:
            side.held = claimed(send(side, None, claim_params())[1])
        for i in range(n):
            for side in in_turn(sides, i):
                ms = step(side)
                if r:
                    side.steps.append(ms)
        for side in sides:
            assert side.held is not None
            written(send(side, finalize_params(*side.held), None)[1], side.held)
            side.held = None
    for side in sides:
        p = side.phase
        p.claim_ms, p.outcome_ms, p.step_ms = Spread.of(side.claims), Spread.of(side.outcomes), Spread.of(side.steps)
        p.claimed = len(side.claims) + len(side.steps)


def rounds_of(claims: int) -> int:
    return -(-claims // ROUND) + 1


# ---------------------------------------------------------------- the server's side


def explain(db: DB) -> tuple[str, str]:
    """EXPLAIN (ANALYZE, BUFFERS) of one claim and of its job's finalize, in a
    transaction that is rolled back. Rolled back by hand, not by raising out of
    db.transaction(): the pool closes a connection left by an exception."""
    with db.connection() as conn:
        conn.autocommit = False
        try:
            with conn.cursor() as cur:
                cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + Q.job_claim, claim_params())
                claim = "\n".join(r[0] for r in cur.fetchall())
                cur.execute(
                    "SELECT id, attempts FROM jobs WHERE queue = %s AND status = 'started' AND worker_id = %s",
                    (QUEUE, WORKER_ID),
                )
                job = cur.fetchone()
                if job is None:
                    raise RuntimeError("the explained claim claimed nothing")
                sql, params = lone_step(Ask(finalize_params(*job), None))
                cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
                finalize = "\n".join(r[0] for r in cur.fetchall())
        finally:
            conn.rollback()
    return claim, finalize


def execution_ms(plan: str) -> float:
    found = dict(_TIMING.findall(plan))
    if "Execution" not in found:
        raise RuntimeError(f"no execution time in the plan:\n{plan}")
    return float(found["Execution"])


def buffers(plan: str) -> int:
    """Shared buffers hit and read by the plan's top node (the first Buffers line),
    which for a Function Scan counts the function's own statements."""
    match = _BUFFERS.search(plan)
    if match is None:
        return 0
    return sum(int(n) for n in re.findall(r"(?:hit|read)=(\d+)", match.group(1)))


def server_side(side: Side) -> dict[str, str]:
    plans = [explain(side.db) for _ in range(EXPLAINS)]
    p = side.phase
    p.claim_exec_ms = Spread.of([execution_ms(c) for c, _ in plans])
    p.finalize_exec_ms = Spread.of([execution_ms(f) for _, f in plans])
    p.claim_buffers = Spread.of([buffers(c) for c, _ in plans])
    p.finalize_buffers = Spread.of([buffers(f) for _, f in plans])
    p.table_mb, p.index_mb = sizes(side.db)
    return {"claim": plans[-1][0], "finalize": plans[-1][1]}


AUTO_EXPLAIN = {
    "auto_explain.log_analyze": "on",
    "auto_explain.log_buffers": "on",
    "auto_explain.log_timing": "on",
    "auto_explain.log_nested_statements": "on",
    "auto_explain.log_level": "notice",
    "auto_explain.log_format": "text",
    "client_min_messages": "notice",
    # The functions set it for their own statements; the same for the outer ones.
    "plan_cache_mode": "force_generic_plan",
}


def nested_plans(url: str) -> tuple[list[dict[str, Any]], str | None]:
    """The plans auto_explain logs for one claim and its job's finalize (rolled
    back), the statements inside jobs_step_one included: a list
    of {statement, duration_ms, buffers, scans, plan}; or why there are none."""
    conn = admin_connect(url)
    conn.notices = deque()  # unbounded: a plain list keeps only the last 50
    try:
        with conn.cursor() as cur:
            try:
                cur.execute("LOAD 'auto_explain'")
            except psycopg2.Error as exc:
                return [], f"auto_explain could not be loaded: {str(exc).strip()}"
            conn.autocommit = False
            for name, value in AUTO_EXPLAIN.items():
                cur.execute(f"SET LOCAL {name} = {value}")
            # Once unlogged, so the functions' plans are made and cached first.
            for logged in (False, True):
                if logged:
                    cur.execute("SET LOCAL auto_explain.log_min_duration = 0")
                    conn.notices.clear()
                cur.execute(Q.job_claim, claim_params())
                row = cur.fetchone()
                if row is None or row[0] is None:
                    raise RuntimeError("the auto_explain claim claimed nothing")
                cur.execute(*lone_step(Ask(finalize_params(row[0], row[3]), None)))
                cur.fetchall()
            conn.rollback()
        return [_logged(n) for n in conn.notices if "plan:" in n], None
    finally:
        conn.close()


def _logged(notice: str) -> dict[str, Any]:
    head, _, body = notice.partition("\n")
    duration = float(re.search(r"duration: ([\d.]+) ms", head).group(1))  # type: ignore[union-attr]
    lines = body.rstrip("\n").splitlines()
    # The plan's first line is its top node, the first with a cost; the query text is above it.
    start = next(i for i, line in enumerate(lines) if "(cost=" in line)
    text = " ".join(" ".join(lines[:start]).removeprefix("Query Text:").split())
    plan = "\n".join(lines[start:])
    return {
        "statement": text,
        "duration_ms": duration,
        "buffers": buffers(plan),
        "scans": _SCAN.findall(plan),
        "plan": plan,
    }


# ---------------------------------------------------------------- the run


def measure(scratches: list[Scratch], phases: list[Phase], args: argparse.Namespace) -> dict[str, Any]:
    """Fill both tables, time the sends alternating between them, then the
    server's side of each."""
    sides = []
    try:
        for scratch, phase in zip(scratches, phases, strict=True):
            # One pool connection (the EXPLAINs) and the reserved one (the group commit).
            db = DB.connect(scratch.url, size=1, application_name="jobs-bench")
            sides.append(Side(phase, db, Committer(db)))
            print(
                f"({phase.label}) filling: {phase.finished} finished, {phase.backlog.rows} backlog,"
                f" {phase.pending} pending of the queue ...",
                flush=True,
            )
            fill(db, phase)
        print(f"timing {args.claims} claims alone, outcomes alone and outcome + next claim on each ...", flush=True)
        time_sends(sides, args.claims)
        print("EXPLAIN (ANALYZE, BUFFERS) and auto_explain on each ...", flush=True)
        explains, nested, missing = {}, {}, None
        for scratch, side in zip(scratches, sides, strict=True):
            explains[side.phase.label] = server_side(side)
            nested[side.phase.label], missing = nested_plans(scratch.url)
            left = side.db.query_row("SELECT count(*) FROM jobs WHERE status = 'started'")[0]
            if left:
                raise RuntimeError(f"{left} rows were left started: an EXPLAIN was not rolled back")
    finally:
        for side in sides:
            side.db.close()
    return {"explain": explains, "nested": nested, "auto_explain_missing": missing}


def backlog_of(args: argparse.Namespace) -> Backlog:
    others = args.backlog - args.queue_due - args.queue_delayed
    delayed = others // OTHER_DELAYED_EVERY
    return Backlog(args.queue_due, args.queue_delayed, args.other_queues, others - delayed, delayed)


# ---------------------------------------------------------------- report


def _ratio(a: Spread | None, b: Spread | None) -> float | None:
    return b.p50 / a.p50 if a and b and a.p50 else None


def report(phases: list[Phase], server: dict[str, Any]) -> dict[str, Any]:
    a, b = phases
    return {
        "phases": [asdict(p) for p in phases],
        # (b) over (a), of the p50: the headline is the outcome with the next claim.
        "p50_ratio": _ratio(a.step_ms, b.step_ms),
        "ratios": {
            "outcome + next claim (client)": _ratio(a.step_ms, b.step_ms),
            "claim alone (client)": _ratio(a.claim_ms, b.claim_ms),
            "outcome alone (client)": _ratio(a.outcome_ms, b.outcome_ms),
            "claim execution (srv)": _ratio(a.claim_exec_ms, b.claim_exec_ms),
            "finalize execution (srv)": _ratio(a.finalize_exec_ms, b.finalize_exec_ms),
            "claim buffers (srv)": _ratio(a.claim_buffers, b.claim_buffers),
            "finalize buffers (srv)": _ratio(a.finalize_buffers, b.finalize_buffers),
        },
        "target": TARGET,
        **server,
    }


def _spread(s: dict[str, float] | None, digits: int = 3) -> str:
    if s is None:
        return f"{'n/a':>9}" * 4
    return "".join(f"{s[k]:>9.{digits}f}" for k in ("mean", "p50", "p99", "max"))


def _title(p: dict[str, Any]) -> str:
    if not p["finished"] and not p["backlog"]["queue_due"] + p["backlog"]["other_due"]:
        return f"({p['label']}) queue only"
    return f"({p['label']}) +{p['finished'] / 1e6:g}M fin."


def print_table(result: dict[str, Any]) -> None:
    options = result["options"]
    print(
        f"\n{options['claims']} timed jobs of each kind per table (after {options['warmup']} untimed),"
        f" in rounds of {ROUND}, alternating between (a) and (b)"
    )
    print("client: the group commit's send as a poller makes it (one job_step_one round trip and commit)")
    print(
        f"srv: {options['explains']} rolled-back EXPLAIN (ANALYZE, BUFFERS) "
        "of job_claim / job_step_one (outcome), no commit"
    )
    print(f"{'':>18}  {'ms':<30}{'mean':>9}{'p50':>9}{'p99':>9}{'max':>9}")
    for p in result["phases"]:
        rows = [
            ("outcome + next claim (client)", p["step_ms"], 3),
            ("claim alone (client)", p["claim_ms"], 3),
            ("outcome alone (client)", p["outcome_ms"], 3),
            ("claim execution (srv)", p["claim_exec_ms"], 3),
            ("finalize execution (srv)", p["finalize_exec_ms"], 3),
            ("claim buffers (srv, count)", p["claim_buffers"], 0),
            ("finalize buffers (srv, count)", p["finalize_buffers"], 0),
        ]
        for i, (what, spread, digits) in enumerate(rows):
            print(f"{_title(p) if i == 0 else '':>18}  {what:<30}{_spread(spread, digits)}")
    print()
    for p in result["phases"]:
        rows = ", ".join(f"{k} {v:,}" for k, v in p["rows"].items())
        indexes = ", ".join(f"{k} {v:.1f}" for k, v in p["index_mb"].items() if v >= 0.05)
        print(f"({p['label']}) rows: {rows}")
        print(
            f"    fill {p['fill_s']:.1f} s, vacuum analyze {p['vacuum_s']:.1f} s"
            f"{', checkpoint' if p['checkpoint'] else ', no checkpoint (no privilege)'};"
            f" jobs {p['table_mb']:.1f} MB with indexes ({indexes or 'all under 0.1 MB'})"
        )
    print(f"\n(b)/(a) of the p50 (target: at most {result['target']:g}):")
    for what, ratio in result["ratios"].items():
        shown = "n/a" if ratio is None else f"{ratio:.2f}"
        print(f"  {what:<32}{shown:>6}")
    headline = result["p50_ratio"]
    if headline is not None:
        verdict = "met" if headline <= result["target"] else "NOT met"
        target = result["target"]
        print(f"claim cost, outcome + next claim p50 (b)/(a): {headline:.2f}x, target <= {target:g}x: {verdict}")
    print_plans(result)


def print_plans(result: dict[str, Any]) -> None:
    print("\nEXPLAIN (ANALYZE, BUFFERS) of job_claim at (b), rolled back (the statements inside count in its Buffers):")
    print(result["explain"]["b"]["claim"])
    if result["auto_explain_missing"]:
        print(f"\nno nested plans: {result['auto_explain_missing']}")
        return
    a, b = result["nested"]["a"], result["nested"]["b"]
    print("\nauto_explain, one claim then its finalize (generic plans; nested statements first, then the call):")
    print(f"  {'#':>2} {'statement':<62}{'(a) buf':>8}{'(b) buf':>8}{'(a) ms':>8}{'(b) ms':>8}  scans")
    for i, nb in enumerate(b):
        # The same statement at (a), by its text's start (the calls' texts hold the ids).
        na = a[i] if len(a) == len(b) and a[i]["statement"][:40] == nb["statement"][:40] else None
        a_buf, a_ms = (str(na["buffers"]), f"{na['duration_ms']:.3f}") if na else ("-", "-")
        print(
            f"  {i + 1:>2} {nb['statement'][:60]:<62}{a_buf:>8}{nb['buffers']:>8}{a_ms:>8}{nb['duration_ms']:>8.3f}"
            f"  {'; '.join(nb['scans']) or '-'}"
        )
        if na and na["scans"] != nb["scans"]:
            print(f"  {'':>2} {'':<62}{'':>32}  at (a): {'; '.join(na['scans']) or '-'}")
    for label, logged in (("a", a), ("b", b)):
        seq = [f"#{i + 1}" for i, n in enumerate(logged) if any(s.startswith("Seq Scan on jobs") for s in n["scans"])]
        print(f"  sequential scans of jobs at ({label}): {', '.join(seq) if seq else 'none'}")
    print("\nthe nested statements' plans at (b):")
    for i, n in enumerate(b):
        if n["scans"]:  # the calls themselves are a Function Scan, shown above
            print(f"-- {i + 1}: {n['statement'][:100]}")
            print(n["plan"])


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--finished", type=int, default=1_000_000, help="finished rows of (b) (default %(default)s)")
    parser.add_argument("--backlog", type=int, default=100_000, help="more pending rows of (b) (default %(default)s)")
    parser.add_argument(
        "--queue-due", type=int, default=5_000, help="of the backlog, due on the measured queue (default %(default)s)"
    )
    parser.add_argument(
        "--queue-delayed",
        type=int,
        default=3_000,
        help="of the backlog, delayed on the measured queue (default %(default)s)",
    )
    parser.add_argument(
        "--other-queues", type=int, default=39, help="queues the rest of the backlog spreads over (default %(default)s)"
    )
    parser.add_argument("--claims", type=int, default=300, help="timed jobs of each kind (default %(default)s)")
    parser.add_argument(
        "--pending", type=int, default=700, help="pending rows of the queue in both tables (default %(default)s)"
    )
    add_pgbench_seconds(parser)
    args = parser.parse_args(argv)
    if args.finished < 0 or args.claims < 1:
        parser.error("--finished >= 0, --claims >= 1")
    # Each round claims one job more than it times; the EXPLAINs' claims are rolled back.
    least = 2 * (args.claims + WARMUP) + rounds_of(args.claims) + 1
    if args.pending < least:
        parser.error(f"--pending >= {least} for {args.claims} claims")
    if min(args.queue_due, args.queue_delayed) < 0 or args.backlog < args.queue_due + args.queue_delayed:
        parser.error("--backlog must hold --queue-due and --queue-delayed")
    if args.other_queues < 1 and args.backlog > args.queue_due + args.queue_delayed:
        parser.error("--other-queues >= 1 for a backlog beyond the measured queue's")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def measured(server: Server, rate: CommitRate) -> dict[str, Any]:
        phases = [Phase("a", 0, args.pending, Backlog()), Phase("b", args.finished, args.pending, backlog_of(args))]
        with ExitStack() as stack:
            scratches = [stack.enter_context(scratch_database(server)) for _ in phases]
            names = ", ".join(f"({p.label}) {s.name}" for p, s in zip(phases, scratches, strict=True))
            print(f"bench databases {names}", flush=True)
            found = measure(scratches, phases, args)
        return {**report(phases, found), "options": {**vars(args), "warmup": WARMUP, "explains": EXPLAINS}}

    return harness.run("claim_flat", args, measured, print_table)


if __name__ == "__main__":
    sys.exit(main())
