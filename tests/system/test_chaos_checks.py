"""The chaos test's checks on hand-made runs: that they catch what they are
for, and do not take the way a SIGKILL lands for a broken guarantee."""

from __future__ import annotations

from test_chaos import IN_FLIGHT, Report, Run, check_no_overlap, close_open_runs

KILLER = 100  # a pid that was killed at KILLED_AT
OTHER = 200  # a pid that was not
KILLED_AT = 1000.0


def analysed(*runs: Run) -> Report:
    report = Report(jobs={}, runs=list(runs), starts={})
    close_open_runs(report, {KILLER: KILLED_AT})
    check_no_overlap(report)
    return report


def test_a_run_cut_by_its_kill_ends_at_the_kill() -> None:
    cut = Run(1, "q", 1, KILLER, start=KILLED_AT - 0.5)
    rescue = Run(1, "q", 2, OTHER, start=KILLED_AT + 3.0, end=KILLED_AT + 3.1)
    report = analysed(cut, rescue)
    assert (cut.end, cut.cut) == (KILLED_AT, True)
    assert not report.violations


def test_a_run_cut_by_its_kill_ends_no_later_than_its_process_next_run_of_the_queue() -> None:
    cut = Run(1, "q", 1, KILLER, start=KILLED_AT - 0.5)
    report = analysed(cut, Run(2, "q", 1, KILLER, start=KILLED_AT - 0.2, end=KILLED_AT - 0.1))
    assert cut.end == KILLED_AT - 0.2
    assert not report.violations


def test_a_start_record_the_server_ran_just_after_the_kill_is_a_run_that_ended_as_it_began() -> None:
    # The record was on its way when the process died; the job is rescued
    # once its lease is out, which is no overlap.
    in_flight = Run(1, "q", 1, KILLER, start=KILLED_AT + 0.0001)
    rescue = Run(1, "q", 2, OTHER, start=KILLED_AT + 3.0, end=KILLED_AT + 3.1)
    report = analysed(in_flight, rescue)
    assert (in_flight.end, in_flight.cut) == (in_flight.start, True)
    assert not report.violations


def test_a_start_long_after_the_kill_is_an_open_run_and_overlaps_what_follows() -> None:
    late = Run(1, "q", 1, KILLER, start=KILLED_AT + IN_FLIGHT + 0.5)
    rescue = Run(1, "q", 2, OTHER, start=KILLED_AT + 3.0, end=KILLED_AT + 3.1)
    report = analysed(late, rescue)
    assert report.violations["open run"] == [f"job 1 attempt 1 by pid {KILLER} never ended"]
    assert len(report.violations["overlap"]) == 1


def test_a_run_of_a_process_nobody_killed_that_never_ended_is_an_open_run() -> None:
    report = analysed(Run(1, "q", 1, OTHER, start=KILLED_AT))
    assert report.violations["open run"] == [f"job 1 attempt 1 by pid {OTHER} never ended"]


def test_two_runs_of_a_queue_at_once_are_an_overlap_and_back_to_back_are_not() -> None:
    first = Run(1, "q", 1, OTHER, start=10.0, end=11.0)
    overlapping = Run(2, "q", 1, KILLER, start=10.5, end=12.0)
    back_to_back = Run(3, "q", 1, OTHER, start=12.0, end=13.0)
    elsewhere = Run(4, "r", 1, OTHER, start=10.2, end=10.8)
    report = analysed(first, overlapping, back_to_back, elsewhere)
    assert report.violations["overlap"] == [
        f"q: job 2/1 (pid {KILLER}) started at 10.500 while job 1/1 (pid {OTHER}) ran until 11.000"
    ]
    assert report.max_overlap == 2
