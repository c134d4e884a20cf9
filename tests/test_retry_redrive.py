import pytest

from lib.insert import insert
from lib.poller import Poller
from lib.redrive import redrive
from lib.retry import CAP_SECONDS, backoff


def test_backoff_grows_then_caps_with_jitter_in_the_upper_half():
    assert backoff(1, rand=0.0) == 5.0 and backoff(1, rand=0.999) == pytest.approx(9.995)
    assert backoff(2, rand=0.0) == 10.0
    assert backoff(3, rand=0.5) == 30.0
    assert backoff(50, rand=0.0) == CAP_SECONDS / 2
    assert backoff(10_000, rand=0.999) <= CAP_SECONDS
    steps = [backoff(n, rand=0.0) for n in range(1, 12)]
    assert steps == sorted(steps)
    with pytest.raises(ValueError):
        backoff(0)


def test_backoff_spreads_jobs_that_failed_together():
    waits = {round(backoff(3), 3) for _ in range(50)}
    assert len(waits) > 40 and all(20.0 <= w < 40.0 for w in waits)


def test_redrive_returns_failed_jobs_with_their_error_kept(db):
    def boom(job):
        raise RuntimeError("vendor down")

    poller = Poller("q", db, {"q.N": boom, "q.M": lambda job: "ok"})
    failed = insert(db, "q", "q.N")
    other = insert(db, "q", "q.N")
    fine = insert(db, "q", "q.M")
    for _ in range(3):
        poller.work_once()
    assert redrive(db, ids=[failed, fine]) == [failed]  # an ok job is not a failure
    row = db.query_row("SELECT status, attempts, max_attempts, last_error FROM jobs WHERE id = %s", (failed,))
    assert row == ("pending", 1, 2, "err: RuntimeError: vendor down")
    assert db.query_row("SELECT status FROM jobs WHERE id = %s", (other,))[0].startswith("err:")
    # It runs again as attempt 2, and fails for good this time.
    assert poller.work_once() == "err: RuntimeError: vendor down"
    assert db.query_row("SELECT status, attempts FROM jobs WHERE id = %s", (failed,)) == (
        "err: RuntimeError: vendor down",
        2,
    )
    assert redrive(db, queue="q", name="q.N") == [failed, other]


def test_redrive_needs_a_filter(db):
    with pytest.raises(ValueError):
        redrive(db)
