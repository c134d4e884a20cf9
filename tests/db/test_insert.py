import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import psycopg2
import pytest
from tests_support import count_jobs, make_poller, run_python

from lib.insert import MAX_ARGS_BYTES, InvalidJob, Job, insert, insert_many
from lib.store.sql import Q


def test_rolled_back_transaction_leaves_no_job(db, database_url):
    conn = psycopg2.connect(database_url)
    with conn.cursor() as cur:
        cur.execute("INSERT INTO cache_entries VALUES ('k', '1', now())")
    job_id = insert(conn, "q", "q.Run", {"k": "k"})
    assert job_id is not None
    conn.rollback()
    conn.close()
    assert count_jobs(db) == 0
    assert make_poller("q", db, {"q.Run": lambda job: "ok"}).work_once() is None


def test_committed_transaction_job_is_worked(db, database_url):
    conn = psycopg2.connect(database_url)
    job_id = insert(conn, "q", "q.Run", {"k": "k"})
    # Uncommitted: invisible to the worker.
    assert make_poller("q", db, {"q.Run": lambda job: "ok"}).work_once() is None
    conn.commit()
    conn.close()
    seen = []
    assert make_poller("q", db, {"q.Run": lambda job: seen.append(job.id) or "ok"}).work_once() == "ok"
    assert seen == [job_id]


def test_insert_inside_the_projects_own_transaction(db):
    with pytest.raises(RuntimeError), db.transaction() as tx:
        insert(tx, "q", "q.Run")
        raise RuntimeError
    assert count_jobs(db) == 0
    with db.transaction() as tx:
        insert(tx, "q", "q.Run")
    assert count_jobs(db) == 1


_PLAIN = """
import sys
from lib.insert import insert
assert "gevent" not in sys.modules and "psycogreen" not in sys.modules, sorted(sys.modules)
import socket
assert socket.socket.__module__ == "socket", "socket was patched"
{connect}
ids = [insert(conn, "q", "q.Plain", {{"n": 1}}), insert(conn, "q", "q.Plain", {{"n": 2}})]
conn.rollback()
ids = [insert(conn, "q", "q.Plain", {{"n": 3}})]
conn.commit()
assert "gevent" not in sys.modules
print(ids[0])
"""


@pytest.mark.parametrize(
    "connect",
    [
        "import psycopg2; conn = psycopg2.connect({url!r})",
        "import psycopg; conn = psycopg.connect({url!r})",
    ],
    ids=["psycopg2", "psycopg3"],
)
def test_plain_synchronous_process_enqueues(db, database_url, connect):
    done = run_python(_PLAIN.format(connect=connect.format(url=database_url)))
    assert done.returncode == 0, done.stderr
    job_id = int(done.stdout)
    rows = db.query("SELECT id, name, args, status FROM jobs")
    assert rows == [(job_id, "q.Plain", {"n": 3}, "pending")]  # the rolled-back two are gone
    assert make_poller("q", db, {"q.Plain": lambda job: "ok"}).work_once() == "ok"


def test_callsite_is_relative_to_the_repo_root(db):
    job_id = insert(db, "q", "q.X")
    (callsite,) = db.query_row("SELECT callsite FROM jobs WHERE id = %s", (job_id,))
    assert callsite.startswith("tests/db/test_insert.py:")


def test_an_explicit_callsite_names_the_writer_instead(db):
    job_id = insert(db, "q", "q.N", callsite="cli")
    assert db.query_row("SELECT callsite FROM jobs WHERE id = %s", (job_id,)) == ("cli",)


def test_dataclass_args_and_defaults(db):
    @dataclass
    class Args:
        login: str
        force: bool = False

    when = datetime.now(UTC) + timedelta(hours=1)
    job_id = insert(db, "q", "q.X", Args("ada"), run_at=when, priority=5, max_attempts=3)
    row = db.query_row("SELECT args, run_at, priority, max_attempts, attempts FROM jobs WHERE id = %s", (job_id,))
    assert row == ({"login": "ada", "force": False}, when, 5, 3, 0)


@pytest.mark.parametrize(
    ("queue", "name", "args", "kw", "says"),
    [
        ("", "q.X", None, {}, "queue"),
        ("q", " ", None, {}, "name"),
        ("q ", "q.X", None, {}, "queue"),
        ("q", "q.X", {"s": {1, 2}}, {}, "JSON-serialisable"),
        ("q", "q.X", {"f": float("nan")}, {}, "JSON-serialisable"),
        ("q", "q.X", [1, 2], {}, "mapping"),
        ("q", "q.X", {"s": "a\x00b"}, {}, "NUL"),
        ("q", "q.X", {"s": "x" * MAX_ARGS_BYTES}, {}, "limit"),
        ("q", "q.X", None, {"run_at": datetime(2030, 1, 1)}, "timezone"),
        ("q", "q.X", None, {"max_attempts": 0}, "max_attempts"),
        ("q", "q.X", None, {"priority": "high"}, "priority"),
    ],
)
def test_bad_input_is_refused_before_anything_is_written(db, queue, name, args, kw, says):
    with pytest.raises(InvalidJob, match=says):
        insert(db, queue, name, args, **kw)
    assert count_jobs(db) == 0


def test_args_just_under_the_limit_are_taken(db):
    filler = "x" * (MAX_ARGS_BYTES - len(json.dumps({"s": ""}, separators=(",", ":"))))
    assert insert(db, "q", "q.X", {"s": filler}) is not None


def compact_size(args: Any) -> int:
    return len(json.dumps(args, separators=(",", ":"), ensure_ascii=False).encode())


def args_of(size: int, item: Any) -> dict[str, Any]:
    """Args of exactly `size` bytes as compact UTF-8 JSON: a list of item,
    and a string that makes up the rest."""
    args: dict[str, Any] = {"items": [item], "pad": ""}
    each = compact_size([item, item]) - compact_size([item])
    args["items"] = [item] * ((size - compact_size(args)) // each)
    args["pad"] = "x" * (size - compact_size(args))
    assert compact_size(args) == size
    return args


# Items that jsonb prints longer than compact JSON: a separator after each
# key and element (", " and ": "), and characters of two to four bytes.
WIDE_ITEMS = [0, {"é": ["ü", 1]}, 'naïve 😀 \u2028 "quoted"']


@pytest.mark.parametrize("item", WIDE_ITEMS, ids=["ints", "objects", "strings"])
@pytest.mark.parametrize("how", ["insert", "insert_many"])
def test_args_at_the_limit_are_run_and_one_byte_more_refused(db, item, how):
    """The limit is one measure at insert and at claim: args the insert
    takes are run, whatever jsonb makes of their separators and characters."""
    write = (
        (lambda args: insert(db, "q", "q.Big", args))
        if how == "insert"
        else (lambda args: insert_many(db, [Job("q", "q.Big", args)])[0])
    )
    at_limit = args_of(MAX_ARGS_BYTES, item)
    (printed,) = db.query_row("SELECT octet_length(%s::jsonb::text)", (json.dumps(at_limit),))
    assert printed > MAX_ARGS_BYTES  # what today's claim measured
    job_id = write(at_limit)
    seen: list[Any] = []
    poller = make_poller("q", db, {"q.Big": lambda job: seen.append(job.args) or "ok"})
    assert poller.work_once() == "ok", db.query_row("SELECT status FROM jobs WHERE id = %s", (job_id,))
    assert seen == [at_limit]
    with pytest.raises(InvalidJob, match=f"args are {MAX_ARGS_BYTES + 1} bytes as compact JSON"):
        write(args_of(MAX_ARGS_BYTES + 1, item))
    assert count_jobs(db) == 1


def test_large_floats_count_the_digits_the_database_keeps(db):
    """Python writes 1e+300 in six characters; jsonb keeps it as 301 digits,
    and the claim reads back the int 10**300: the insert counts the digits,
    as the claim does."""
    at_limit = args_of(MAX_ARGS_BYTES, 10**300)
    floats = {**at_limit, "items": [1e300] * len(at_limit["items"])}
    assert compact_size(floats) < MAX_ARGS_BYTES // 10
    job_id = insert(db, "q", "q.Big", floats)
    seen: list[Any] = []
    poller = make_poller("q", db, {"q.Big": lambda job: seen.append(job.args) or "ok"})
    assert poller.work_once() == "ok", db.query_row("SELECT status FROM jobs WHERE id = %s", (job_id,))
    assert seen == [at_limit]
    over = args_of(MAX_ARGS_BYTES + 1, -(10**300))
    with pytest.raises(InvalidJob, match=f"args are {MAX_ARGS_BYTES + 1} bytes as compact JSON"):
        insert(db, "q", "q.Big", {**over, "items": [-1e300] * len(over["items"])})
    assert count_jobs(db) == 1


def test_insert_many_in_one_statement(db, database_url):
    later = datetime.now(UTC) + timedelta(minutes=5)
    jobs = [Job("q", "q.A", {"i": 1}), Job("q", "q.B", {"i": 2}, run_at=later, priority=2), Job("r", "r.C")]
    conn = psycopg2.connect(database_url)
    ids = insert_many(conn, jobs)
    conn.commit()
    conn.close()
    assert ids == sorted(ids) and len(ids) == 3
    rows = db.query("SELECT id, queue, name, args, priority, run_at = %s, callsite FROM jobs ORDER BY id", (later,))
    assert [r[1:5] for r in rows] == [("q", "q.A", {"i": 1}, 0), ("q", "q.B", {"i": 2}, 2), ("r", "r.C", {}, 0)]
    assert [r[5] for r in rows] == [False, True, False]
    assert all(r[6].startswith("tests/db/test_insert.py:") for r in rows)
    assert insert_many(db, []) == []


def test_insert_many_keeps_each_jobs_fields_and_order(db):
    """Ids come back in the order given, a suppressed duplicate left out, each
    naming the row built from its own job, whatever the mix of fields."""
    db.exec(Q.dedupe_declare, {"queue": "dq", "names": ["dq.Once"]})
    later = datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=ZoneInfo("Asia/Kolkata"))
    jobs = [
        Job("dq", "dq.Once", {"k": 1}),
        Job("qé", "q.Ünï", {"s": 'naïve "quoted" \\ back\nline', "n": [1, 2.5, None, True]}, priority=-3),
        Job("dq", "dq.Once", {"k": 1}),  # a copy of the first: no id
        Job("q", "q.Late", run_at=later, max_attempts=4, priority=2**31 - 1),
        Job("dq", "dq.Once", {"k": 2}),
    ]
    ids = insert_many(db, jobs)
    assert len(ids) == 4 and ids == sorted(ids)
    rows = db.query("SELECT id, queue, name, args, run_at, priority, max_attempts, dedupe FROM jobs ORDER BY id")
    written = [jobs[0], jobs[1], jobs[3], jobs[4]]
    assert rows == [
        (i, j.queue, j.name, j.args or {}, j.run_at or r[4], j.priority, j.max_attempts, j.queue == "dq")
        for i, j, r in zip(ids, written, rows, strict=True)
    ]
    assert rows[2][4] == later


def test_insert_many_with_psycopg3(db, database_url):
    import psycopg

    with psycopg.connect(database_url) as conn:
        ids = insert_many(conn, [Job("q", "q.A"), Job("q", "q.B", {"x": [1, 2]}, max_attempts=2)])
    assert len(ids) == 2
    assert db.query("SELECT name, args, max_attempts FROM jobs ORDER BY id") == [
        ("q.A", {}, None),
        ("q.B", {"x": [1, 2]}, 2),
    ]


def test_insert_many_refuses_a_bad_job_and_writes_none(db):
    with pytest.raises(InvalidJob):
        insert_many(db, [Job("q", "q.A"), Job("q", "")])
    assert count_jobs(db) == 0
