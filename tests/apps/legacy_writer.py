"""An application still on the original service's enqueue, for tests of an
upgrade under load: one INSERT every 10 ms in autocommit, each timed, until
SIGTERM. One JSON line per insert to the file named by argv[2]: n (the
insert's number, also its args' "n"), the id it got (None on an error), when
it began (the wall clock, to set beside a log's times), how long the
statement took, and the error's text, if any.

A plain process, no gevent and nothing of the project's code: it times its
statements as an application's own thread would see them. Its session's
zone is UTC whatever the database's is, as an application server's often
is: the original table's timestamps are then written in a zone other than
the server's.

Usage: legacy_writer.py DATABASE_URL OUT_FILE
"""

import json
import signal
import sys
import time

import psycopg2

# The original service's insert (reference/original-go-service.txt).
INSERT = "INSERT INTO jobs (queue, name, callsite, args) VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING id"
QUEUE, NAME, CALLSITE = "legacy", "legacy.Work", "app/enqueue.go:42"
EVERY = 0.01

stopping = False


def _stop(signum, frame) -> None:
    global stopping
    stopping = True


def insert(cur, n: int) -> tuple[int | None, str | None]:
    try:
        cur.execute(INSERT, (QUEUE, NAME, CALLSITE, json.dumps({"n": n})))
        return cur.fetchone()[0], None
    except psycopg2.Error as exc:
        return None, f"{type(exc).__name__}: {exc}".strip()


def main(url: str, out_path: str) -> None:
    signal.signal(signal.SIGTERM, _stop)
    conn = psycopg2.connect(url, application_name="legacy-writer", options="-c TimeZone=UTC")
    conn.autocommit = True
    with open(out_path, "w") as out, conn.cursor() as cur:
        n = 0
        while not stopping:
            at, began = time.time(), time.monotonic()
            job_id, error = insert(cur, n)
            took = time.monotonic() - began
            out.write(json.dumps({"n": n, "id": job_id, "at": at, "took": took, "error": error}) + "\n")
            out.flush()
            n += 1
            time.sleep(EVERY)
    conn.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
