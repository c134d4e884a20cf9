"""Our side of bench/compare.py, enqueuing: a plain synchronous program (no
gevent), as a web app or a script that enqueues would be, through lib.insert.

  bulk:    --jobs jobs, --batch per transaction (1: insert() on an autocommit
           connection; more: insert_many() and a commit), timed; prints
           {"seconds": ...}
  produce: one job per commit with a random pause, through
           bench/apps/wake_producer.py's own loop; prints [[seq, commit time], ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import psycopg2

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import wake_producer
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


def main() -> int:
    args = enqueue_parser(__doc__).parse_args()
    queues = args.queues.split(",")
    conn = psycopg2.connect(args.url, application_name="jobs-bench-enqueue")
    try:
        if args.mode == "bulk":
            json.dump({"seconds": bulk(conn, queues, args.jobs, args.batch)}, sys.stdout)
        else:
            producer = argparse.Namespace(
                queue=queues[0], name=JOB_NAME, count=args.jobs, gap_min=args.gap_min, gap_max=args.gap_max
            )
            json.dump(wake_producer.single(conn, producer), sys.stdout)
    finally:
        conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
