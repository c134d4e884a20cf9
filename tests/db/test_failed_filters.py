"""The failed lists by their optional filters: the failed command's
(job_failed) and the admin page's (job_failed_list). The pool plans them for
their values on every run (sql/: "-- plan: custom"); whatever the plan, each
combination of filters answers what a plain reading of the filters says."""

import itertools
from datetime import timedelta

from factory import Job, make_job

from lib.store.db import DB
from lib.store.sql import Q

# (queue, name, status, finished this long ago); every one at its own instant.
ROWS = [
    ("a", "a.X", "err: one", timedelta(minutes=1)),
    ("a", "a.X", "err: two", timedelta(minutes=2)),
    ("a", "a.Y", "err: three", timedelta(minutes=3)),
    ("b", "b.X", "err: four", timedelta(minutes=4)),
    ("a", "a.X", "err: five", timedelta(hours=5)),
    ("b", "b.X", "err: six", timedelta(days=6)),
    ("a", "a.X", "fail: answered", timedelta(minutes=7)),
    ("a", "a.X", "ok", timedelta(minutes=8)),
    ("a", "a.X", "skip: nothing", timedelta(minutes=9)),
    ("a", "a.X", "pending", None),
    ("b", "b.X", "started", None),
]


def _plant(db: DB) -> list[Job]:
    return [
        make_job(db, queue, name, status=status, attempts=1, finished_at=None if ago is None else -ago)
        for queue, name, status, ago in ROWS
    ]


def _expected(rows: list[Job], *, ids, queue, name, since, limit, now) -> list[int]:
    picked = [
        r
        for r in rows
        if r.status.startswith("err: ")
        and (ids is None or r.id in ids)
        and (queue is None or r.queue == queue)
        and (name is None or r.name == name)
        and (since is None or r.finished_at > now - timedelta(seconds=since))
    ]
    picked.sort(key=lambda r: (r.finished_at, r.id), reverse=True)
    return [r.id for r in picked[:limit]]


def test_each_combination_of_filters_lists_the_failures_it_names(database_url, db):
    rows = _plant(db)
    (now,) = db.query_row("SELECT now()")
    ids = [rows[0].id, rows[3].id, rows[5].id, rows[6].id]
    pool = DB.connect(database_url, size=1)  # one connection: what it prepared would be used again
    try:
        for got_ids, queue, name, since, limit in itertools.product(
            (None, ids), (None, "a", "b", "none"), (None, "a.X", "b.X"), (None, 3600.0), (None, 2)
        ):
            want = _expected(rows, ids=got_ids, queue=queue, name=name, since=since, limit=limit, now=now)
            params = {"ids": got_ids, "queue": queue, "name": name, "since": since, "limit": limit}
            assert [r[0] for r in pool.query(Q.job_failed, params)] == want, params
            if got_ids is None and since is None:
                listed = pool.query(Q.job_failed_list, {"queue": queue, "name": name, "limit": limit})
                assert [r[0] for r in listed] == want, params
    finally:
        pool.close()
