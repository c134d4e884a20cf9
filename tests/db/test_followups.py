"""Follow-ups (PendingJob.then): written in the transaction that stores the
outcome they were added for, and only with it; checked when the handler
returns, so a bad one fails its job, saying which."""

from dataclasses import replace

import gevent
import psycopg2
import pytest
from gevent.event import Event
from tests_support import make_poller

from lib.insert import insert
from lib.run import followups as followup_jobs
from lib.run.execute import Outcome
from lib.run.runtime import Runtime


def followups(db, queue: str = "next"):
    return db.query("SELECT name, args, callsite, status FROM jobs WHERE queue = %s ORDER BY id", (queue,))


def test_a_followup_is_written_with_the_ok_outcome_that_adds_it(db):
    def lead(job):
        job.then("next", "next.Post", {"lead": job.args["n"]}, priority=3, key="lead-7")
        return "ok"

    poller = make_poller("leads", db, {"leads.Enrich": lead})
    parent = insert(db, "leads", "leads.Enrich", {"n": 7})
    assert poller.work_once() == "ok"
    assert followups(db) == [("next.Post", {"lead": 7}, f"then of job {parent}", "pending")]
    assert db.query_row("SELECT priority, key FROM jobs WHERE queue = 'next'") == (3, "lead-7")


def test_a_run_that_raises_adds_none_and_the_retry_that_ends_ok_adds_one(db):
    runs = []

    def flaky(job):
        job.then("next", "next.Post", {"run": len(runs)})
        runs.append(job.attempts)
        if len(runs) == 1:
            raise RuntimeError("the API was down")
        return "ok"

    poller = make_poller("leads", db, {"leads.Enrich": flaky}, max_attempts=3, retry_base=0.01)
    job_id = insert(db, "leads", "leads.Enrich", {})
    assert poller.work_once() == "err: RuntimeError: the API was down"
    assert followups(db) == []
    db.exec("UPDATE jobs SET run_at = now() WHERE id = %s", (job_id,))
    assert poller.work_once() == "ok"
    assert [args for _, args, _, _ in followups(db)] == [{"run": 1}]


def test_when_chooses_the_outcomes_that_write_a_followup(db):
    def answer(job):
        job.then("next", "next.OnFail", when=("ok", "fail"))
        job.then("next", "next.OnOk")
        job.then("next", "next.OnSkip", when="skip")
        return "fail: no such lead"

    poller = make_poller("leads", db, {"leads.Enrich": answer})
    insert(db, "leads", "leads.Enrich", {})
    assert poller.work_once() == "fail: no such lead"
    assert [name for name, *_ in followups(db)] == ["next.OnFail"]


def test_then_refuses_an_outcome_it_cannot_follow(db):
    def answer(job):
        job.then("next", "next.N", when="err")

    poller = make_poller("leads", db, {"leads.Enrich": answer}, max_attempts=1)
    insert(db, "leads", "leads.Enrich", {})
    status = poller.work_once()
    assert status.startswith("err: ValueError: then(when=...) takes 'ok', 'fail' or 'skip'"), status


@pytest.mark.parametrize(
    ("follow", "said"),
    [
        (lambda job: job.then("next", " spaced "), "follow-up next/ spaced refused: name must be a non-empty string"),
        (lambda job: job.then("next", "next.N", {"a": {1, 2}}), "follow-up next/next.N refused: args"),
        (lambda job: job.then("next", "next.N", priority="high"), "follow-up next/next.N refused: priority"),
    ],
)
def test_a_bad_followup_fails_its_job_saying_which_and_is_not_retried(db, follow, said):
    def answer(job):
        follow(job)
        return "ok"

    poller = make_poller("leads", db, {"leads.Enrich": answer}, max_attempts=5)
    job_id = insert(db, "leads", "leads.Enrich", {})
    status = poller.work_once()
    assert status.startswith(f"err: BadFollowUp: {said}"), status
    assert db.query_row("SELECT status, attempts FROM jobs WHERE id = %s", (job_id,)) == (status, 1)
    assert followups(db) == []


def test_a_followup_no_worker_handles_fails_its_job(db):
    def answer(job):
        job.then("next", "next.Known")
        job.then("nowhere", "nowhere.N")
        return "ok"

    alone = Runtime.alone(db)
    runtime = replace(alone, known={"leads": frozenset({"leads.Enrich"}), "next": frozenset({"next.Known"})})
    poller = make_poller("leads", db, {"leads.Enrich": answer}, runtime=runtime)
    insert(db, "leads", "leads.Enrich", {})
    status = poller.work_once()
    assert status == "err: BadFollowUp: follow-up nowhere/nowhere.N: no worker handles that queue and job name"
    assert followups(db) == []


def test_an_outcome_sent_again_after_its_reply_was_lost_adds_no_second_copy(db):
    """The first send committed and its answer never came: the second finds
    the row no longer started by this claim, and writes nothing."""
    poller = make_poller("leads", db, {"leads.Enrich": lambda job: "ok"})
    insert(db, "leads", "leads.Enrich", {})
    job = poller.claim()
    job.then("next", "next.Post")
    decided = replace(Outcome("ok"), followups=followup_jobs.to_write(job, "ok", None, None, db))
    params = poller.steps.outcome_params(job, decided, 0.0)
    first = poller.steps._send_with_followups(job, params, decided)
    again = poller.steps._send_with_followups(job, params, decided)
    assert (first.written, again.written) == (True, True)
    assert len(followups(db)) == 1


def test_a_rescued_job_writes_neither_its_outcome_nor_its_followups(db):
    def answer(job):
        job.then("next", "next.Post")
        # Meanwhile its lease lapsed and another worker took the row over.
        db.exec("UPDATE jobs SET worker_id = 'another', attempts = attempts + 1 WHERE id = %s", (job.id,))
        return "ok"

    poller = make_poller("leads", db, {"leads.Enrich": answer})
    job_id = insert(db, "leads", "leads.Enrich", {})
    assert poller.work_once() == "ok"
    assert db.query_row("SELECT status, worker_id FROM jobs WHERE id = %s", (job_id,)) == ("started", "another")
    assert followups(db) == []


def test_a_row_another_transaction_holds_delays_the_outcome_and_its_followups(db, database_url):
    held = psycopg2.connect(database_url)

    def answer(job):
        job.then("next", "next.Post")
        with held.cursor() as cur:
            cur.execute("SELECT 1 FROM jobs WHERE id = %s FOR UPDATE", (job.id,))
        gevent.spawn_later(0.5, held.commit)
        return "ok"

    poller = make_poller("leads", db, {"leads.Enrich": answer})
    job_id = insert(db, "leads", "leads.Enrich", {})
    try:
        assert poller.work_once() == "ok"
    finally:
        held.close()
    assert db.query_row("SELECT status FROM jobs WHERE id = %s", (job_id,)) == ("ok",)
    assert len(followups(db)) == 1


def test_jobs_that_add_none_still_go_with_the_next_claim(db):
    """The write of an outcome without follow-ups carries the slot's next
    claim, as before: one round trip a job on a busy queue."""
    poller = make_poller("leads", db, {"leads.Enrich": lambda job: "ok"})
    for _ in range(3):
        insert(db, "leads", "leads.Enrich", {})
    job = poller.claim()
    found = poller.work(job, wakeup=Event()).found
    assert found is not None and found.job is not None
