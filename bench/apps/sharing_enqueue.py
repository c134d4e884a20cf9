"""An application that enqueues, for bench/enqueue_concurrency.py and
bench/live_upgrade.py: a plain synchronous program (psycopg2, no gevent) that
writes one job a transaction in a loop and notes each write: when it began,
how long it took to commit, the id written, and the error when it failed.

  lib     BEGIN; lib.insert.insert(cur, queue, name, args); COMMIT
  plain   BEGIN; the INSERT that jobs_insert makes (the same columns, the
          same dedupe read, ON CONFLICT DO NOTHING RETURNING id), prepared
          once, in a session where the statement trigger is passed over as
          jobs_insert passes it over (jobs.inserting_checked): the row, its
          indexes and its commit, without the NOTIFY; COMMIT
  text    the same as plain, sent as text at each call (as an application's
          psycopg2 code sends its INSERT, and as lib.insert sends its call)
  table   BEGIN; INSERT INTO bench_plain (queue, args) VALUES ($1, $2)
          RETURNING id, prepared once; COMMIT: one row into a plain table of
          the benchmark's (a bigserial key, no other index, no trigger),
          what the server allows an enqueue of any library
  legacy  the original Go service's Insert, in autocommit:
          INSERT INTO jobs (queue, name, callsite, args) VALUES ($1, $2, $3,
          $4::jsonb) ON CONFLICT DO NOTHING RETURNING id; prepared once on the
          session as pgx's statement cache does, and prepared again after an
          error says the plan went stale (the call that met it failed, as it
          does in pgx)

It connects, waits for --start-at (so that every client starts together),
then writes until --seconds after it or SIGTERM, at most one job every
--every seconds (0: as fast as it goes; a write that ran late does not make
the next ones hurry, as a Go ticker drops the ticks it missed). It prints
JSON: {"began": [...], "took": [...], "ids": [...], "errors": [[at, sqlstate,
message], ...]}, times in seconds of time.time().
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.extensions

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from lib.insert import insert

JOB_NAME = "bench.Noop"
# jobs_insert's own INSERT (sql/rules/insert.sql) with the values lib.insert sends for a plain job.
PLAIN = """
PREPARE plain_insert(text, text, jsonb, text) AS
INSERT INTO jobs (queue, name, args, callsite, run_at, priority, max_attempts, key, dedupe)
VALUES ($1, $2, $3, $4, now(), 0, NULL, NULL,
        EXISTS (SELECT FROM job_dedupe_names d WHERE d.queue = $1 AND d.name = $2))
ON CONFLICT DO NOTHING
RETURNING id
"""
LEGACY = """
PREPARE legacy_insert(text, text, text, text) AS
INSERT INTO jobs (queue, name, callsite, args)
VALUES ($1, $2, $3, $4::jsonb)
ON CONFLICT DO NOTHING
RETURNING id
"""
# The same INSERT as an application's psycopg2 code sends it: as text, planned at each call.
TEXT = """
INSERT INTO jobs (queue, name, args, callsite, run_at, priority, max_attempts, key, dedupe)
VALUES (%(queue)s, %(name)s, %(args)s, %(callsite)s, now(), 0, NULL, NULL,
        EXISTS (SELECT FROM job_dedupe_names d WHERE d.queue = %(queue)s AND d.name = %(name)s))
ON CONFLICT DO NOTHING
RETURNING id
"""
# A plain table's one-row INSERT (the table: bench/compare_sharing.py's PLAIN_TABLE).
TABLE = """
PREPARE table_insert(text, jsonb) AS
INSERT INTO bench_plain (queue, args) VALUES ($1, $2) RETURNING id
"""
STALE_PLAN = "cached plan must not change result type"


class Writer:
    def __init__(self, conn: psycopg2.extensions.connection, mode: str) -> None:
        self.conn, self.mode = conn, mode
        self.cur = conn.cursor()
        self.prepared = False
        if mode in ("plain", "text"):
            # What jobs_insert sets around its own INSERT, for the session: the
            # statement trigger (a dedupe check and the NOTIFY) does not run.
            self.cur.execute("SET jobs.inserting_checked = 'on'")
            conn.commit()
        conn.autocommit = mode == "legacy"

    def prepare(self, sql: str) -> None:
        if not self.prepared:
            self.cur.execute(sql)
            self.prepared = True

    def one(self, queue: str, args: dict[str, Any]) -> int | None:
        text = json.dumps(args)
        if self.mode == "lib":
            found = insert(self.cur, queue, JOB_NAME, args)
        elif self.mode == "plain":
            self.prepare(PLAIN)
            self.cur.execute("EXECUTE plain_insert(%s, %s, %s, %s)", (queue, JOB_NAME, text, "sharing_enqueue"))
            row = self.cur.fetchone()
            found = row[0] if row else None
        elif self.mode == "table":
            self.prepare(TABLE)
            self.cur.execute("EXECUTE table_insert(%s, %s)", (queue, text))
            found = self.cur.fetchone()[0]
        elif self.mode == "text":
            params = {"queue": queue, "name": JOB_NAME, "args": text, "callsite": "sharing_enqueue"}
            self.cur.execute(TEXT, params)
            row = self.cur.fetchone()
            found = row[0] if row else None
        else:
            self.prepare(LEGACY)
            self.cur.execute("EXECUTE legacy_insert(%s, %s, %s, %s)", (queue, JOB_NAME, "legacy/insert.go:1", text))
            row = self.cur.fetchone()
            found = row[0] if row else None
        if not self.conn.autocommit:
            self.conn.commit()
        return found

    def failed(self, exc: psycopg2.Error) -> None:
        if not self.conn.autocommit:
            self.conn.rollback()
        if STALE_PLAN in str(exc):
            self.cur.execute("DEALLOCATE ALL")
            self.prepared = False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("lib", "plain", "text", "table", "legacy"))
    parser.add_argument("--url", required=True)
    parser.add_argument("--queues", default="q00", help="comma-separated; the writes go round robin over them")
    parser.add_argument("--client", type=int, default=0, help="this client's number: its args, its first queue")
    parser.add_argument("--start-at", type=float, default=0.0, help="time.time() to begin at (default: at once)")
    parser.add_argument("--seconds", type=float, default=0.0, help="how long to write (0: until SIGTERM)")
    parser.add_argument("--every", type=float, default=0.0, help="seconds between writes (0: back to back)")
    args = parser.parse_args()

    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    queues = args.queues.split(",")
    conn = psycopg2.connect(args.url, application_name=f"jobs-bench-{args.mode}")
    writer = Writer(conn, args.mode)
    began: list[float] = []
    took: list[float] = []
    ids: list[int | None] = []
    errors: list[tuple[float, str | None, str]] = []
    time.sleep(max(0.0, args.start_at - time.time()))
    start = time.time()
    # The window is the same for every client: one that was ready late writes for less of it.
    end = (args.start_at or start) + args.seconds if args.seconds else float("inf")
    tick = start
    n = 0
    while not stop:
        at = time.time()
        if at >= end:
            break
        queue = queues[(args.client + n) % len(queues)]
        try:
            found = writer.one(queue, {"client": args.client, "seq": n})
        except psycopg2.Error as exc:
            done = time.time()
            errors.append((at, exc.pgcode, str(exc).strip()))
            writer.failed(exc)
            found = None
        else:
            done = time.time()
        began.append(at)
        took.append(done - at)
        ids.append(found)
        n += 1
        if args.every:
            tick = max(tick + args.every, done)
            time.sleep(max(0.0, tick - time.time()))
    conn.close()
    json.dump({"began": began, "took": took, "ids": ids, "errors": errors}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
