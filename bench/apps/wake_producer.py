"""The producer of bench/wakeups.py: a separate, plain process (no gevent, no
monkey-patching), as a web app or a cron script that enqueues would be.

It enqueues through lib.insert in its own transactions and prints, as JSON on
stdout, [seq, time.time() right after the commit returned] for each commit.

  single: --count jobs, one per transaction, --gap-min..--gap-max seconds apart
  bulk:   one set-based INSERT ... SELECT of --count rows, one commit
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import psycopg2
import psycopg2.extensions

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from lib.insert import insert

# A statement of the caller's own, not lib.insert: the point is that any writer
# wakes the pollers, and one statement wakes them once.
BULK_SQL = (
    "INSERT INTO jobs (queue, name, args) "
    "SELECT %(queue)s, %(name)s, jsonb_build_object('seq', i) FROM generate_series(1, %(count)s) AS i"
)


def single(conn: psycopg2.extensions.connection, args: argparse.Namespace) -> list[tuple[int, float]]:
    commits = []
    for seq in range(args.count):
        insert(conn, args.queue, args.name, {"seq": seq})
        conn.commit()
        commits.append((seq, time.time()))
        # A random gap, so the commits never fall into step with anything periodic in the worker.
        time.sleep(random.uniform(args.gap_min, args.gap_max))
    return commits


def bulk(conn: psycopg2.extensions.connection, args: argparse.Namespace) -> list[tuple[int, float]]:
    with conn.cursor() as cur:
        cur.execute(BULK_SQL, {"queue": args.queue, "name": args.name, "count": args.count})
    conn.commit()
    return [(-1, time.time())]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("single", "bulk"))
    parser.add_argument("--url", required=True)
    parser.add_argument("--queue", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--gap-min", type=float, default=0.05)
    parser.add_argument("--gap-max", type=float, default=0.1)
    args = parser.parse_args()
    conn = psycopg2.connect(args.url, application_name="jobs-bench-producer")
    try:
        commits = single(conn, args) if args.mode == "single" else bulk(conn, args)
    finally:
        conn.close()
    json.dump(commits, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
