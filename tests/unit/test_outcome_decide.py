"""The one decision of what a job's row stores: each thing that can happen
to a job, with attempts left and without. Pure: no database, no clock."""

import pytest

from lib.background.leases import LeaseLost
from lib.job import Snooze
from lib.job import status as st
from lib.run.execute import (
    Abandon,
    ArgsUnreadable,
    BadArgs,
    BadStatus,
    Fenced,
    GiveBack,
    Interrupted,
    JobTimeout,
    LeftForAnother,
    Outcome,
    Raised,
    Returned,
    Snoozed,
    TimedOut,
    UnknownJob,
    UnknownName,
    decide,
    fault,
)

BASE = 10.0


class Final(Exception):
    final = True


def test_a_returned_status_is_stored_as_it_is_and_counted():
    for status in ("ok", "ok: done", "fail: no such repo", "skip: nothing to do"):
        outcome = decide(Returned(status), 1, 3)
        assert outcome == Outcome(status)
        assert outcome.stored == status and outcome.counted and outcome.retry_in is None


def test_a_snooze_returns_the_job_to_pending_for_its_seconds_uncounted():
    outcome = decide(Snoozed(Snooze(42.0, "skip: rate limited")), 1, 1)
    assert isinstance(outcome, Outcome)
    assert (outcome.stored, outcome.status, outcome.retry_in, outcome.counted) == (
        st.PENDING,
        "skip: rate limited",
        42.0,
        False,
    )
    assert outcome.hold == 0.0


def test_a_snooze_that_holds_the_queue_keeps_the_job_in_its_place_and_holds_the_queue():
    outcome = decide(Snoozed(Snooze(42.0, "skip: rate limited", hold_queue=True)), 1, 1)
    assert isinstance(outcome, Outcome)
    # retry_in 0 keeps run_at: the job stays the queue's next.
    assert (outcome.stored, outcome.retry_in, outcome.counted, outcome.hold) == (st.PENDING, 0.0, False, 42.0)


def test_an_interrupted_job_goes_back_in_its_place_while_attempts_remain():
    again = decide(Interrupted(), 1, 2)
    assert isinstance(again, Outcome)
    assert (again.stored, again.status, again.retry_in, again.counted) == (st.PENDING, st.INTERRUPTED, 0.0, True)
    last = decide(Interrupted(), 2, 2)
    assert isinstance(last, Outcome)
    assert (last.stored, last.retry_in) == (st.INTERRUPTED, None)


@pytest.mark.parametrize(
    ("happened", "status"),
    [
        (Raised(RuntimeError("vendor down")), "err: RuntimeError: vendor down"),
        (Raised(BadStatus("handler returned int, not a status string")), "err: BadStatus: handler returned int"),
        (TimedOut(JobTimeout("timed out after 1s")), "err: JobTimeout: timed out after 1s"),
        (ArgsUnreadable(BadArgs("args are NULL")), "err: BadArgs: args are NULL"),
        (UnknownName(UnknownJob("unknown job 'q.X' for queue q")), "err: UnknownJob: unknown job 'q.X'"),
    ],
)
def test_a_fault_is_retried_with_backoff_while_attempts_remain_then_ends_err(happened, status):
    first = decide(happened, 1, 3, retry_base=BASE)
    assert isinstance(first, Outcome)
    assert first.status.startswith(status) and first.stored == st.PENDING and first.counted
    assert BASE / 2 <= first.retry_in <= BASE
    assert first.error is happened.error
    second = decide(happened, 2, 3, retry_base=BASE)
    assert isinstance(second, Outcome) and BASE <= second.retry_in <= 2 * BASE
    last = decide(happened, 3, 3, retry_base=BASE)
    assert isinstance(last, Outcome)
    assert last.retry_in is None and last.stored == last.status and last.status.startswith(status)
    assert fault(happened) is happened.error


def test_a_fault_marked_final_ends_the_job_though_attempts_remain():
    outcome = decide(Raised(Final("may have been sent")), 1, 5)
    assert isinstance(outcome, Outcome)
    assert outcome.retry_in is None and outcome.stored == "err: Final: may have been sent"


def test_a_fenced_job_stores_nothing_and_one_left_for_another_is_given_back():
    assert isinstance(decide(Fenced(LeaseLost("lease of job 1 not renewed in time")), 1, 3), Abandon)
    assert isinstance(decide(LeftForAnother(), 1, 3), GiveBack)


def test_only_faults_are_reported():
    snooze = Snooze(1.0, "skip: later")
    for happened in (Returned("ok"), Snoozed(snooze), Interrupted(), LeftForAnother(), Fenced(LeaseLost("x"))):
        assert fault(happened) is None


def test_anything_else_is_a_bug_not_an_outcome():
    with pytest.raises(TypeError):
        decide("ok", 1, 1)  # type: ignore[arg-type]
