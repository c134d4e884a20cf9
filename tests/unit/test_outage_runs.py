"""Outage: one report a run, one line a minute while it lasts, and a run that
a part's success in the middle of it does not end (quiet)."""

import logging

from lib.setup import error_reports
from lib.setup.error_reports import Outage


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_success_while_others_still_fail_does_not_end_a_quiet_outage(sentry_events, caplog):
    """A database read-only for a spell: its writes fail now and then, its
    reads succeed in between. One event for the spell, and its end said once
    the quiet time has passed without a failure."""
    clock = Clock()
    outage = Outage("database", clock=clock, quiet=60.0)
    with caplog.at_level(logging.WARNING, logger="jobs.errors"):
        for t in (0, 20, 45, 75, 100):
            clock.now = t
            outage.failed(OSError(f"read-only at {t}"))
            clock.now = t + 1
            outage.recovered()  # a read between the failures
            assert outage.failing
        clock.now = 161
        outage.recovered()
        assert not outage.failing
        clock.now = 170
        outage.failed(OSError("another day"))
    assert [e["exception"]["values"][0]["value"] for e in sentry_events] == ["read-only at 0", "another day"]
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(":")[0] for line in lines] == [
        "database failing",
        "database still failing",
        "database recovered after 5 failures over 161.0s",
        "database failing",
    ], lines


def test_a_long_run_says_it_goes_on_once_a_minute(caplog):
    clock = Clock()
    outage = Outage("database", clock=clock)
    with caplog.at_level(logging.WARNING, logger="jobs.errors"):
        for t in range(0, 300, 2):
            clock.now = t
            outage.failed(OSError("down"))
    goes_on = [r.getMessage() for r in caplog.records if "still failing" in r.getMessage()]
    assert len(goes_on) == 4 and goes_on[0].startswith("database still failing: 31 failures over 60s"), goes_on


def test_without_quiet_a_success_ends_the_run(sentry_events):
    outage = Outage("fetch")
    outage.failed(OSError("down"))
    outage.recovered()
    assert not outage.failing
    outage.failed(OSError("down again"))
    assert len(sentry_events) == 2
    assert error_reports.SAY_EVERY == 60.0
