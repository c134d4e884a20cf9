"""Each attempt's error is kept with its traceback (jobs.attempt_errors,
migration 025), and shown by the job page and `show`."""

from tests_support import make_poller

from lib.insert import insert
from lib.operate import overview
from lib.run.steps import Ask, lone_step


def test_each_failed_attempt_keeps_its_error_and_traceback(db):
    tries = []

    def flaky(job):
        tries.append(job.attempts)
        if job.attempts < 3:
            raise ValueError(f"bad try {job.attempts}")
        raise KeyError("last")

    p = make_poller("ae", db, {"ae.N": flaky}, max_attempts=3, retry_base=0.001)
    job_id = insert(db, "ae", "ae.N")
    for _ in range(3):
        db.exec("UPDATE jobs SET run_at = now() WHERE id = %s", (job_id,))  # due again at once
        p.work_once()
    job = overview.job(db, job_id)
    assert tries == [1, 2, 3]
    errors = job["attempt_errors"]
    assert [e["attempt"] for e in errors] == [1, 2, 3]
    assert "ValueError: bad try 1" in errors[0]["error"] and "ValueError: bad try 2" in errors[1]["error"]
    assert "KeyError" in errors[2]["error"] and errors[2]["error"] == job["last_error"]
    assert all("in flaky" in e["traceback"] for e in errors)
    assert all(e["worker"] for e in errors)


def test_an_outcome_sent_twice_is_kept_once_and_an_ok_adds_nothing(db):
    p = make_poller("ae2", db, {"ae2.N": lambda job: "ok"}, max_attempts=2)
    job_id = insert(db, "ae2", "ae2.N")
    job = p.claim()
    outcome = {
        "id": job_id, "worker_id": p.steps.leases.worker_id, "attempts": 1, "status": "err: boom",
        "retry_in": None, "last_error": "err: boom", "last_traceback": "tb", "delay": 0, "uncounted": 0,
    }  # fmt: skip
    assert job.id == job_id
    for _ in range(2):  # the reply was lost: sent again, as the writer does
        db.query(*lone_step(Ask(outcome, None)))
    assert [e["error"] for e in overview.job(db, job_id)["attempt_errors"]] == ["err: boom"]
    ok_id = insert(db, "ae2", "ae2.N")
    assert p.work_once() == "ok"
    assert overview.job(db, ok_id)["attempt_errors"] == []
