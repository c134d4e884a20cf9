"""Steps (PendingJob.step): a step's fn runs once per job, across retries
and rescues, its result stored as soon as it returns; a result or a name
that cannot be stored fails the job for good, naming the step; a job that
calls no step sends no statement about steps; a redrive keeps the steps
unless told to start afresh."""

from __future__ import annotations

from typing import Any

import pytest
from tests_support import make_poller

from lib.background.leases import Leases
from lib.insert import MAX_ARGS_BYTES, insert
from lib.job import PendingJob
from lib.operate.redrive import redrive
from lib.run.runtime import Runtime
from lib.store.db import DB
from lib.store.sql import Q


class Recording(DB):
    """The pool, noting each statement sent through it (the group commit's
    reserved connection aside): what a job's run asked of the database."""

    def __init__(self, *args: Any, **options: Any) -> None:
        super().__init__(*args, **options)
        self.sent: list[str] = []

    def exec(self, sql: str, params: Any = None) -> int:
        self.sent.append(sql)
        return super().exec(sql, params)

    def query_row(self, sql: str, params: Any = None) -> Any:
        self.sent.append(sql)
        return super().query_row(sql, params)

    def query(self, sql: str, params: Any = None) -> Any:
        self.sent.append(sql)
        return super().query(sql, params)

    def about_steps(self) -> list[str]:
        return [sql for sql in self.sent if "job_steps" in sql]


@pytest.fixture
def recording(db: DB, database_url: str):
    pool = Recording.connect(database_url, size=4, application_name="jobs-test-steps")
    yield pool
    pool.close()


class Paid:
    """A step's work, counting its calls: an API call billed each time."""

    def __init__(self, result: Any = None) -> None:
        self.calls = 0
        self.result = {"summary": "three lines", "tokens": [1200, 350]} if result is None else result

    def __call__(self) -> Any:
        self.calls += 1
        return self.result


def stored(db: DB, job_id: int) -> dict[str, Any]:
    return dict(db.query("SELECT name, result FROM job_steps WHERE job_id = %s", (job_id,)))


def due_now(db: DB, job_id: int) -> None:
    db.exec("UPDATE jobs SET run_at = now() WHERE id = %s", (job_id,))


def test_a_step_runs_once_across_a_retry(db):
    """The handler fails after its step; the retry gets the stored result
    and the step's fn is not called again. The result is JSON's on both
    runs (a tuple comes back a list)."""
    paid = Paid({"summary": "three lines", "tokens": (1200, 350)})
    seen = []

    def summarise(job):
        seen.append(job.step("summary", paid))
        if len(seen) == 1:
            raise RuntimeError("the post that follows failed")
        return "ok"

    poller = make_poller("ai", db, {"ai.Summarise": summarise}, max_attempts=3, retry_base=0.01)
    job_id = insert(db, "ai", "ai.Summarise", {"doc": 7})
    assert poller.work_once() == "err: RuntimeError: the post that follows failed"
    assert stored(db, job_id) == {"summary": {"summary": "three lines", "tokens": [1200, 350]}}
    due_now(db, job_id)
    assert poller.work_once() == "ok"
    assert paid.calls == 1
    assert seen == [{"summary": "three lines", "tokens": [1200, 350]}] * 2


def test_a_step_runs_once_across_a_rescue(db):
    """A worker claims the job, runs its step, and dies: the rescue returns
    the row to pending, and another worker's run gets the stored result."""
    paid = Paid()

    def summarise(job):
        job.step("summary", paid)
        return "ok"

    dead = make_poller("ai", db, {"ai.Summarise": summarise}, max_attempts=2, runtime=Runtime.alone(db))
    job_id = insert(db, "ai", "ai.Summarise", {})
    job = dead.claim()
    assert job is not None and job.id == job_id
    job.step("summary", paid)  # what its handler did before its worker died
    db.exec("UPDATE jobs SET lease_until = now() - interval '1 second' WHERE id = %s", (job_id,))
    rescued = Leases(db, worker_id="rescuer").rescue()
    assert [(i, status) for i, _, _, status in rescued] == [(job_id, "pending")]
    other = make_poller("ai", db, {"ai.Summarise": summarise}, max_attempts=2, runtime=Runtime.alone(db))
    assert other.work_once() == "ok"
    assert paid.calls == 1
    assert db.query_row("SELECT status, attempts FROM jobs WHERE id = %s", (job_id,)) == ("ok", 2)


def test_two_steps_are_read_in_one_statement_a_run(recording):
    """Each step is stored as it returns; the retry reads both in one
    statement, at its first step, and stores nothing."""
    first, second = Paid({"a": 1}), Paid(["b", 2])
    runs = []

    def two_steps(job):
        runs.append((job.step("first", first), job.step("second", second), job.step("first", first)))
        if len(runs) == 1:
            raise RuntimeError("down after both")
        return "ok"

    poller = make_poller("ai", recording, {"ai.Two": two_steps}, max_attempts=2, retry_base=0.01)
    job_id = insert(recording, "ai", "ai.Two", {})
    recording.sent.clear()
    assert poller.work_once() == "err: RuntimeError: down after both"
    assert recording.about_steps() == [Q.job_steps_read, Q.job_step_keep, Q.job_step_keep]
    due_now(recording, job_id)
    recording.sent.clear()
    assert poller.work_once() == "ok"
    assert recording.about_steps() == [Q.job_steps_read]
    assert (first.calls, second.calls) == (1, 1)
    assert runs == [({"a": 1}, ["b", 2], {"a": 1})] * 2
    assert stored(recording, job_id) == {"first": {"a": 1}, "second": ["b", 2]}


def test_a_job_that_calls_no_step_sends_nothing_about_steps(recording):
    seen = []

    def plain(job):
        seen.append(job)
        return "ok"

    poller = make_poller("plain", recording, {"plain.N": plain})
    insert(recording, "plain", "plain.N", {})
    recording.sent.clear()
    assert poller.work_once() == "ok"
    assert recording.about_steps() == []
    assert seen[0].step_store is not None and seen[0].step_results is None


@pytest.mark.parametrize(
    ("result", "said"),
    [
        ({"tags": {"a", "b"}}, "its result cannot be stored as JSON: Object of type set is not JSON serializable"),
        ({"score": float("nan")}, "its result cannot be stored as JSON: Out of range float values"),
        ("x" * (MAX_ARGS_BYTES + 1), f"its result is {MAX_ARGS_BYTES + 3} bytes as compact JSON; the limit is"),
        ({"text": "a\x00b"}, "its result holds a NUL character"),
        ("\ud800", "its result cannot be stored: "),
    ],
)
def test_a_result_that_cannot_be_stored_fails_the_job_for_good_naming_the_step(db, result, said):
    def summarise(job):
        job.step("summary", lambda: result)
        return "ok"

    poller = make_poller("ai", db, {"ai.Summarise": summarise}, max_attempts=5)
    job_id = insert(db, "ai", "ai.Summarise", {})
    status = poller.work_once()
    assert status.startswith(f"err: BadStep: step 'summary': {said}"), status
    assert db.query_row("SELECT status, attempts FROM jobs WHERE id = %s", (job_id,)) == (status, 1)
    assert stored(db, job_id) == {}


@pytest.mark.parametrize("name", ["", " summary", "s" * 201, 7, None])
def test_a_bad_step_name_fails_the_job_for_good_before_its_fn_runs(db, name):
    paid = Paid()

    def summarise(job):
        job.step(name, paid)
        return "ok"

    poller = make_poller("ai", db, {"ai.Summarise": summarise}, max_attempts=5)
    job_id = insert(db, "ai", "ai.Summarise", {})
    status = poller.work_once()
    assert status.startswith("err: BadStep: step name "), status
    assert db.query_row("SELECT attempts FROM jobs WHERE id = %s", (job_id,)) == (1,)
    assert paid.calls == 0


def test_a_step_whose_fn_raises_stores_nothing_and_runs_again_on_the_retry(db):
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) == 1:
            raise TimeoutError("the API did not answer")
        return "answered"

    poller = make_poller("ai", db, {"ai.Ask": lambda job: f"ok: {job.step('ask', flaky)}"}, max_attempts=2)
    job_id = insert(db, "ai", "ai.Ask", {})
    assert poller.work_once() == "err: TimeoutError: the API did not answer"
    assert stored(db, job_id) == {}
    due_now(db, job_id)
    assert poller.work_once() == "ok: answered"
    assert len(calls) == 2


def test_a_database_error_while_storing_is_the_jobs_fault_and_it_is_retried(db):
    """fn ran, its result was not kept: the error reaches the handler, the
    job is retried, and the retry calls fn again."""
    paid = Paid()
    poller = make_poller("ai", db, {"ai.S": lambda job: job.step("s", paid) and "ok"}, max_attempts=2)
    job_id = insert(db, "ai", "ai.S", {})
    db.exec("ALTER TABLE job_steps ADD CONSTRAINT refused CHECK (name <> 's')")
    try:
        status = poller.work_once()
    finally:
        db.exec("ALTER TABLE job_steps DROP CONSTRAINT refused")
    assert status.startswith('err: CheckViolation: new row for relation "job_steps"'), status
    assert db.query_row("SELECT status FROM jobs WHERE id = %s", (job_id,)) == ("pending",)
    due_now(db, job_id)
    assert poller.work_once() == "ok"
    assert paid.calls == 2


def test_a_result_another_run_stored_meanwhile_is_the_one_returned(db):
    """A run that read the steps before another run (fenced, still going)
    stored one: its own fn's result is not stored over it, and it gets the
    stored one, as every later run will."""
    poller = make_poller("ai", db, {"ai.S": lambda job: "ok"})
    job_id = insert(db, "ai", "ai.S", {})
    job = poller.claim()
    assert job.step("first", Paid({"n": 1})) == {"n": 1}
    db.exec("INSERT INTO job_steps (job_id, name, result) VALUES (%s, 'second', '\"theirs\"')", (job_id,))
    mine = Paid("mine")
    assert job.step("second", mine) == "theirs"
    assert mine.calls == 1
    assert stored(db, job_id) == {"first": {"n": 1}, "second": "theirs"}


def test_a_job_made_outside_a_worker_runs_its_steps_every_time():
    paid = Paid()
    job = PendingJob(1, "ai.S", {})
    assert job.step("s", paid) == job.step("s", paid) == paid.result
    assert paid.calls == 2


def failed_with_a_step(db: DB, paid: Paid) -> tuple[Any, int]:
    """A job that ran its step and then failed, for good (max_attempts 1)."""

    def summarise(job):
        job.step("summary", paid)
        if job.attempts == 1:
            raise RuntimeError("the post failed")
        return "ok"

    poller = make_poller("ai", db, {"ai.Summarise": summarise})
    job_id = insert(db, "ai", "ai.Summarise", {})
    assert poller.work_once() == "err: RuntimeError: the post failed"
    return poller, job_id


def test_a_redrive_keeps_the_steps_and_a_fresh_one_forgets_them(db):
    paid = Paid()
    poller, job_id = failed_with_a_step(db, paid)
    assert redrive(db, ids=[job_id]).redriven == [job_id]
    assert stored(db, job_id) == {"summary": paid.result}
    assert poller.work_once() == "ok"
    assert paid.calls == 1

    again = Paid()
    poller, job_id = failed_with_a_step(db, again)
    untouched = insert(db, "other", "other.N", {})
    db.exec("INSERT INTO job_steps (job_id, name, result) VALUES (%s, 'kept', '1')", (untouched,))
    assert redrive(db, ids=[job_id], fresh=True).redriven == [job_id]
    assert stored(db, job_id) == {}
    assert stored(db, untouched) == {"kept": 1}
    assert poller.work_once() == "ok"
    assert again.calls == 2


def test_a_fresh_redrive_forgets_nothing_of_a_job_it_does_not_redrive(db):
    paid = Paid()
    _, job_id = failed_with_a_step(db, paid)
    db.exec("UPDATE jobs SET status = 'fail: no such doc' WHERE id = %s", (job_id,))
    assert redrive(db, ids=[job_id], fresh=True).redriven == []
    assert stored(db, job_id) == {"summary": paid.result}
