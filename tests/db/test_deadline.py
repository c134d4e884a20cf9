"""lib/greenlets/deadline.py: one timer restarted for each block, and the group
commit's round trip that outlives its deadline."""

import time

import gevent
import pytest
from tests_support import make_poller, updates_held, wait_for, waiting_on

from lib.greenlets.deadline import Deadline, Expired
from lib.insert import insert
from lib.run.execute import Outcome
from lib.run.steps import Committer
from lib.store.driver_errors import NoReply

# The advisory lock key of this module's gate (tests_support.updates_held).
GATE = 7_100_012


def test_each_block_gets_the_full_time_and_a_long_one_is_cut_there():
    """A libev timer stopped and started again keeps what was left of its
    first deadline; the Deadline's counts each block's full time afresh."""
    deadline = Deadline(0.5)
    for _ in range(3):
        with deadline:
            gevent.sleep(0.3)
    began = time.monotonic()
    with pytest.raises(Expired), deadline:
        gevent.sleep(5)
    assert 0.45 <= time.monotonic() - began < 2.5
    # And once more after a block it cut.
    with deadline:
        gevent.sleep(0.3)


def test_the_error_is_made_at_expiry_where_the_block_waited():
    made = []

    def error():
        made.append(1)
        return LookupError("late")

    deadline = Deadline(0.05, error)
    with deadline:
        pass
    assert made == []

    def waits_here():
        gevent.sleep(5)

    with pytest.raises(LookupError) as raised, deadline:
        waits_here()
    assert made == [1]
    assert any(entry.name == "waits_here" for entry in raised.traceback)


def test_a_block_that_catches_the_error_and_goes_on_is_thrown_a_new_one_until_it_ends():
    deadline = Deadline(0.2, again_every=0.1)
    caught = []
    began = time.monotonic()
    with deadline:
        while len(caught) < 3:
            try:
                gevent.sleep(5)
            except Expired as exc:
                caught.append(exc)
    assert 0.35 <= time.monotonic() - began < 3
    assert deadline.expired is caught[0]
    assert len({id(exc) for exc in caught}) == 3
    # Ended: nothing more is thrown into this greenlet, which waits past the period.
    gevent.sleep(0.3)
    with deadline:
        gevent.sleep(0.05)
    assert deadline.expired is None  # a block that ends in time


def test_without_again_every_the_error_is_thrown_once():
    deadline = Deadline(0.1)
    with deadline:
        with pytest.raises(Expired):
            gevent.sleep(5)
        gevent.sleep(0.3)
    assert deadline.expired is not None


def test_a_block_entered_again_before_it_ended_is_refused():
    deadline = Deadline(1)
    with deadline, pytest.raises(RuntimeError), deadline:
        pass


def test_a_round_trip_past_the_committers_deadline_has_no_reply_and_the_next_one_goes(db, database_url):
    """An outcome held in flight (by a trigger) past the
    committer's deadline: NoReply, with the server process that ran it noted
    for settling; the connection is not used again, and the next batch gets
    the deadline's full time."""
    poller = make_poller("late", db, {"late.N": lambda job: "ok"})
    insert(db, "late", "late.N")
    job = poller.claim()
    assert job is not None
    commit = Committer(db, timeout=0.5)
    with updates_held(db, database_url, GATE, f"NEW.id = {job.id} AND NEW.status = 'ok'"):
        began = time.monotonic()
        with gevent.Timeout(10), pytest.raises(NoReply, match=r"no answer within 0\.5s") as raised:
            commit.send(poller.steps.outcome_params(job, Outcome("ok"), 0.0), None)
        assert 0.45 <= time.monotonic() - began < 5
        stuck = raised.value.backend_pid
        assert stuck and db.query_row("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (stuck,)) == (1,)
        db.settle(raised.value)
        wait_for(lambda: not waiting_on(db, "advisory"), timeout=10)
    # The cut batch's connection was not kept: the next batches go on a fresh one.
    for _ in range(3):
        assert commit.send(None, poller.steps.params(None, 1)).row is not None
    assert db.query_row("SELECT status FROM jobs WHERE id = %s", (job.id,)) == ("started",)
