"""A claim's reads do not grow with the jobs finished while another session
holds a snapshot open (sql/rules/rules.sql: jobs_due reads the queue's order
on from its newest claim, jobs_slot_holder reads the slot's newest claim).
The held snapshot keeps every finished job's dead versions in jobs_claim, so a
read of the order from its start steps over one more with every job; these
count the pages each read touches, not its time."""

from collections.abc import Iterator
from typing import Any

import psycopg2
import pytest
from factory import make_jobs

from lib.run.steps import Ask, lone_step
from lib.store.db import DB
from tests.db.test_step_one import claim, outcome

JOBS = 2400


def pages(db: DB, sql: str, params: tuple[Any, ...] = ()) -> int:
    """Shared buffers the statement touched, its functions' own reads included."""
    ((plan,),) = db.query("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params)
    top = plan[0]["Plan"]
    return top["Shared Hit Blocks"] + top["Shared Read Blocks"]


def run(db: DB, jobs: int, queue: str = "q") -> None:
    """jobs of the queue run one after another through the step, as a serial
    poller runs them: each outcome sent with the next claim."""
    done = None
    for _ in range(jobs):
        rows = db.query(*lone_step(Ask(done, claim(queue))))
        (job,) = [r for r in rows if r[0] == queue and r[2] is not None]
        done = outcome(job[2], attempts=job[5])
    db.query(*lone_step(Ask(done, None)))


@pytest.fixture
def held_snapshot(database_url: str) -> Iterator[None]:
    """A report's REPEATABLE READ transaction, open for the whole test."""
    conn = psycopg2.connect(database_url)
    try:
        conn.set_session(isolation_level="REPEATABLE READ")
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM jobs")
        yield
    finally:
        conn.rollback()
        conn.close()


def test_a_claim_reads_as_many_pages_after_thousands_of_jobs_under_a_held_snapshot(db, held_snapshot):
    # Rows of a kilobyte, a few to a page, so that a read's pages count the
    # row versions it steps over. No statistics yet (a table never
    # analyzed): the planner believes the queue small.
    make_jobs(db, JOBS + 10, "q", "q.N", [{"n": n, "pad": "x" * 1000} for n in range(1, JOBS + 11)])
    due = "SELECT * FROM jobs_due('q', NULL, 1)"
    slot = "SELECT * FROM jobs_slot_holder('q', 0)"
    run(db, 200)
    early = pages(db, due), pages(db, slot)
    run(db, JOBS - 200)
    late = pages(db, due), pages(db, slot)

    # The held snapshot keeps what the jobs left: the queue's order read from
    # its start now steps over every job run since it began.
    from_start = pages(
        db,
        "SELECT id FROM jobs WHERE queue = 'q' AND status = 'pending' AND run_at <= now()"
        " ORDER BY -priority, run_at, id LIMIT 1",
    )
    assert from_start > JOBS / 10, from_start
    # The claim's reads stay where they were after 200 jobs, 2,200 jobs later.
    assert late[0] <= early[0] + 8, (early, late)
    assert late[1] <= early[1] + 8, (early, late)
    assert late[0] < from_start / 10, (late, from_start)
