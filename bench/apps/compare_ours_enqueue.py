"""Our side of bench/compare.py, enqueuing: a plain synchronous program (no
gevent), as a web app or a script that enqueues would be, through lib.insert.

  bulk:    --jobs jobs, --batch per transaction (1: insert() on an autocommit
           connection; more: insert_many() and a commit), timed; prints
           {"seconds": ...}
  produce: --jobs jobs, one per commit, a random --gap-min..--gap-max
           seconds apart; prints [[seq, time.time() after the commit], ...]
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

import psycopg2
import psycopg2.extensions

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare_support import OURS_JOB_NAME as JOB_NAME
from compare_support import enqueue_parser, round_robin

from lib.insert import Job, insert, insert_many


def bulk(conn: psycopg2.extensions.connection, queues: list[str], jobs: int, batch: int) -> float:
    rows = round_robin(queues, jobs)
    started = time.perf_counter()
    if batch == 1:
        conn.autocommit = True  # each insert is its own transaction
        for queue, seq in rows:
            insert(conn, queue, JOB_NAME, {"seq": seq})
    else:
        for start in range(0, jobs, batch):
            insert_many(conn, [Job(queue, JOB_NAME, {"seq": seq}) for queue, seq in rows[start : start + batch]])
            conn.commit()
    return time.perf_counter() - started


def produce(
    conn: psycopg2.extensions.connection, queue: str, jobs: int, gap: tuple[float, float]
) -> list[tuple[int, float]]:
    commits = []
    for seq in range(jobs):
        insert(conn, queue, JOB_NAME, {"seq": seq})
        conn.commit()
        commits.append((seq, time.time()))
        # A random gap, so the commits never fall into step with anything periodic in the worker.
        time.sleep(random.uniform(*gap))
    return commits


def main() -> int:
    args = enqueue_parser(__doc__).parse_args()
    queues = args.queues.split(",")
    conn = psycopg2.connect(args.url, application_name="jobs-bench-enqueue")
    try:
        if args.mode == "bulk":
            json.dump({"seconds": bulk(conn, queues, args.jobs, args.batch)}, sys.stdout)
        else:
            json.dump(produce(conn, queues[0], args.jobs, (args.gap_min, args.gap_max)), sys.stdout)
    finally:
        conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
