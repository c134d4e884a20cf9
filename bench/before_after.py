"""This tree against an earlier commit: our rows of bench/compare.py (the
worker alone) and bench/step_cost.py (the step's server CPU), each tree in
turn on the same server, in --pairs pairs whose order alternates (a run
leaves the server dirty buffers and WAL the next one pays for), each row
reported as after over before, pair by pair, and the median.

    .venv/bin/python bench/before_after.py --before 8aa7aba
    .venv/bin/python bench/before_after.py --before HEAD~3 --pairs 5 --workloads 1,3

The earlier commit is checked out into a temporary worktree and run with
this interpreter and that tree's own bench/ and lib/; the server is the
embedded one of this tree, or DATABASE_URL's, for both. The rows
are what each tree's benchmarks print, matched by label: a row one tree
lacks is left out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.errors

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import ROOT, get_server

Rows = dict[str, tuple[float, bool]]  # label: (value, higher is better)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="the commit to compare this tree with")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--workloads", default="1,2,3,4,5", help="bench/compare.py's workloads, ours alone")
    parser.add_argument("--concurrencies", default="256", help="workload 2's sweep")
    parser.add_argument("--jobs", type=int, default=10000)
    parser.add_argument("--steps", type=int, default=3000, help="bench/step_cost.py's steps a round")
    args = parser.parse_args(argv)

    env = {**os.environ, "DATABASE_URL": get_server().url}
    with tempfile.TemporaryDirectory(prefix="jobs-before-") as tmp:
        before = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(before), args.before], cwd=ROOT, check=True)
        try:
            pairs = []
            for n in range(args.pairs):
                trees = {"before": before, "after": ROOT}
                order = ["before", "after"] if n % 2 == 0 else ["after", "before"]
                pairs.append({side: measure(trees[side], args, env) for side in order})
                print_pairs(pairs)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=ROOT, check=True)
    return 0


def measure(tree: Path, args: argparse.Namespace, env: dict[str, str]) -> Rows:
    """One run of each benchmark in tree: its rows."""
    ours = ["--only", "ours", "--workloads", args.workloads, "--concurrencies", args.concurrencies]
    compare = run_saved(tree, "compare", [*ours, "--jobs", str(args.jobs), "--rounds", "1"], env)
    rows: Rows = {row["label"]: (row["values"]["ours"], row["higher_is_better"]) for row in compare["table"]}
    steps = run_saved(tree, "step_cost", ["--steps", str(args.steps), "--rounds", "2"], env)
    for label, found in steps["paths"].items():
        if found["server_cpu_ms"] is not None:
            rows[f"{label}: server CPU (ms)"] = (found["server_cpu_ms"], False)
    return rows


def run_saved(tree: Path, bench: str, options: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Run tree's bench/<bench>.py and read back the result it saved. A
    checkpoint first, so that no run pays for the writes of the one before."""
    checkpoint(env["DATABASE_URL"])
    results = tree / "bench" / "results"
    seen = set(results.glob(f"{bench}-*.json")) if results.exists() else set()
    print(f"running {bench} in {tree} ...", flush=True)
    subprocess.run([sys.executable, f"bench/{bench}.py", *options], cwd=tree, env=env, check=True, capture_output=True)
    (saved,) = set(results.glob(f"{bench}-*.json")) - seen
    return json.loads(saved.read_text())


def checkpoint(url: str) -> None:
    """CHECKPOINT, where the role may (a superuser, or pg_checkpoint's member
    on PostgreSQL 15 and later); else nothing, and the alternating order is
    all that evens the runs out."""
    conn = psycopg2.connect(url)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute("CHECKPOINT")
    except psycopg2.errors.InsufficientPrivilege:
        pass
    finally:
        conn.close()


def print_pairs(pairs: list[dict[str, Rows]]) -> None:
    """Each row's after over before, pair by pair, and their median; above 1
    is more (better for a rate, worse for a time or a CPU cost)."""
    labels = [label for label in pairs[0]["after"] if all(label in pair["before"] for pair in pairs)]
    print(f"\n{'row':52} {'better':>7}  {'after/before, each pair':28} median")
    for label in labels:
        ratios = [pair["after"][label][0] / pair["before"][label][0] for pair in pairs if pair["before"][label][0]]
        better = "higher" if pairs[0]["after"][label][1] else "lower"
        each = " ".join(f"{r:.2f}" for r in ratios)
        print(f"{label:52} {better:>7}  {each:28} {statistics.median(ratios):.2f}")
    print(flush=True)


if __name__ == "__main__":
    sys.exit(main())
