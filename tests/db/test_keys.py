"""Order per key (insert's key=, migration 026): a claim passes over a job
whose key has a job started or one due before it; a unique index is the
database's own guard."""

import psycopg2
import pytest
from prometheus_client import generate_latest
from tests_support import make_poller

from lib.http import metrics
from lib.insert import InvalidJob, Job, insert, insert_many
from lib.operate import overview
from lib.run.steps import Ask, batch_step


def ok(job):
    return "ok"


def plant(db):
    """A1, A2 of key A, B1 of key B and N1 with no key, in that order."""
    return [insert(db, "k", "k.N", {"n": n}, key=key) for n, key in enumerate(["A", "A", "B", None])]


def test_a_claim_passes_over_a_key_that_has_a_job_started(db):
    a1, _a2, b1, n1 = plant(db)
    p = make_poller("k", db, {"k.N": ok}, concurrency=4)
    got = [p.steps.claim(None, slot).job for slot in range(4)]
    assert [j.id if j else None for j in got] == [a1, b1, n1, None]
    assert db.query_row("SELECT key FROM jobs WHERE id = %s", (a1,)) == ("A",)


def test_a_batch_claims_one_job_of_a_key(db):
    a1, _a2, b1, n1 = plant(db)
    p = make_poller("k", db, {"k.N": ok}, concurrency=4)
    rows = db.query(*batch_step([Ask(None, p.steps.params(None, slot)) for slot in range(4)]))
    assert sorted(row[2] for row in rows if row[2] is not None) == [a1, b1, n1]


def test_the_next_job_of_a_key_starts_when_the_one_before_ends(db):
    a1, a2, b1, n1 = plant(db)
    p = make_poller("k", db, {"k.N": ok}, concurrency=1)
    done = [p.work_once() for _ in range(4)]
    assert done == ["ok"] * 4
    order = [r[0] for r in db.query("SELECT id FROM jobs ORDER BY started_at, id")]
    assert order == [a1, a2, b1, n1]  # the queue's order: A2 is due before B1, and A1 ended first


def test_the_unique_index_refuses_a_second_started_job_of_a_key(db):
    a1, a2, *_ = plant(db)
    db.exec("UPDATE jobs SET status = 'started', slot = 0 WHERE id = %s", (a1,))
    with pytest.raises(psycopg2.errors.UniqueViolation):
        db.exec("UPDATE jobs SET status = 'started', slot = 1 WHERE id = %s", (a2,))


def test_insert_many_writes_keys_and_an_older_insert_writes_none(db):
    ids = insert_many(db, [Job("k", "k.N", key="repo:octo/hello"), Job("k", "k.N")])
    assert [r[0] for r in db.query("SELECT key FROM jobs ORDER BY id")] == ["repo:octo/hello", None]
    # The seven-argument function an older lib.insert calls is still there.
    old = db.query_row("SELECT jobs_insert('k', 'k.N', '{}'::jsonb, 'old', NULL, 0, NULL)")[0]
    assert old > max(ids)
    for bad in ("", " spaced", 7, "x" * 201):
        with pytest.raises(InvalidJob):
            insert(db, "k", "k.N", key=bad)


def test_status_and_metrics_count_the_keys_with_work(db):
    plant(db)
    insert(db, "k", "k.N", key="C")
    db.exec("UPDATE jobs SET status = 'ok' WHERE key = 'C'")  # finished: no work
    [k] = overview.queue_stats(db)
    assert k.keys == 2
    text = generate_latest(metrics.registry(db, stats=overview.queue_stats)).decode()
    assert 'jobs_queue_keys{queue="k"} 2.0' in text
