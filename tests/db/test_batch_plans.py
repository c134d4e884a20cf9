"""jobs_step's work grows with its batch, not with its square: no step of
any of its statements handles more than a few rows an ask, however many
times the step runs (a step run once an ask over all the asks would handle
asks x asks). Read from the plans the server ran (auto_explain, with the
rows and loops of each plan node), not from a clock."""

import re

import psycopg2
import pytest
from factory import make_jobs
from test_step_one import claim, outcome
from tests_support import superuser_url

from lib.insert import Job, insert_many
from lib.run.steps import Ask, batch_step
from lib.store.sql import STATEMENTS

# rows is a node's average a run (with decimals on newer servers); loops, how many times it ran.
NODE = re.compile(
    r"^\s*(?:->\s*)?(?P<node>[A-Z][^(]*?)\s+(?:\(cost=[^)]*\)\s+)?\(actual rows=(?P<rows>[\d.]+) loops=(?P<loops>\d+)\)"
)


def run_batch(cur, asks: list[Ask]) -> list[tuple]:
    """The batch as the group commit sends it: prepared, then executed."""
    sql, params = batch_step(asks)
    stmt = STATEMENTS[sql]
    cur.execute(f"DEALLOCATE ALL; {stmt.prepare}")
    cur.execute(stmt.execute, [params[name] for name in stmt.params])
    return cur.fetchall()


def nodes_of_plans(conn, cur, asks: list[Ask]) -> tuple[list[tuple], list[tuple[str, int]]]:
    """The batch's rows, and each plan node of its statements with the rows it handled in all."""
    cur.execute("LOAD 'auto_explain'")
    for setting in ("log_min_duration = 0", "log_analyze = on", "log_timing = off", "log_nested_statements = on"):
        cur.execute(f"SET auto_explain.{setting}")
    cur.execute("SET auto_explain.log_level = notice; SET client_min_messages = notice")
    del conn.notices[:]
    rows = run_batch(cur, asks)
    cur.execute("RESET client_min_messages; SET auto_explain.log_min_duration = -1")
    nodes = []
    for notice in conn.notices:
        for line in notice.splitlines():
            found = NODE.match(line)
            if found:
                nodes.append((found["node"], round(float(found["rows"]) * int(found["loops"]))))
    return rows, nodes


# (queues, slots a queue, pending jobs a queue, finished rows): the planner's
# choices follow the table's statistics, and each case is one where a plan
# that is not linear in the batch was chosen before jobs_step was made so:
# the first two by the outcome statement (030), the third, of queues of a
# hundred jobs, by the heads' lookup (031), which read every due job of a
# queue to claim its first; the last two, of a queue with a backlog, by the
# heads' lock (032), which read the whole table to lock a few heads.
@pytest.mark.parametrize(
    ("queues", "slots", "pending", "finished"),
    [
        (1, 64, 192, 20_000),
        (40, 1, 3, 20_000),
        (40, 1, 100, 5_000),
        (1, 16, 5_000, 20_000),
        (1, 1, 5_000, 5_000),
    ],
)
def test_no_step_of_a_batch_handles_more_than_a_few_rows_an_ask(
    db, database_url, server_url, queues, slots, pending, finished
):
    """A busy batch (each slot's outcome with its next claim) of one queue of
    64 slots, and of 40 queues of one slot (short queues and longer ones),
    their pending jobs beside the finished rows of a table in use and the
    table's statistics read (as autovacuum keeps them)."""
    names = [f"bp{n:02d}" for n in range(queues)]
    insert_many(db, [Job(q, "bp.N") for _ in range(pending) for q in names])
    make_jobs(db, finished, "bp_done", "bp.N", status="ok")
    db.exec("ANALYZE jobs")
    asks = [Ask(None, claim(q, s)) for q in names for s in range(slots)]
    # As the server's superuser: only an administrator may load auto_explain.
    conn = psycopg2.connect(superuser_url(database_url, server_url))
    conn.autocommit = True
    try:
        cur = conn.cursor()
        first = run_batch(cur, asks)
        held = [r for r in first if r[2] is not None]
        assert len(held) == len(asks)
        asks = [Ask(outcome(r[2]), claim(r[0], r[10])) for r in held]
        rows, nodes = nodes_of_plans(conn, cur, asks)
    finally:
        conn.close()
    assert sum(r[0] is None and r[9] is None for r in rows) == len(asks)  # every outcome written
    assert sum(r[0] is not None and r[2] is not None for r in rows) == len(asks)  # every slot claimed again
    assert any(node.startswith("Update on jobs") for node, _ in nodes), nodes  # the plans were read
    most = max(nodes, key=lambda n: n[1])
    assert most[1] <= 4 * len(asks), (most, nodes)
