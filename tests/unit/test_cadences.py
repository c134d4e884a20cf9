"""The clock's cadences and schedule entries: pure functions of fixed datetimes."""

from datetime import UTC, datetime, timedelta, timezone

import pytest
from tests_support import at

from lib.background.clock import Clock, Scheduled, daily, every, floor_minute, hourly, last_match, weekdays


def test_every_counts_minutes_from_midnight():
    quarter = every(15)
    assert [m for m in range(60) if quarter(at(0, 5, m))] == [0, 15, 30, 45]
    assert quarter(at(0, 0, 0, second=59))  # seconds do not matter
    two_hours = every(120)
    assert [h for h in range(24) if two_hours(at(0, h, 0))] == list(range(0, 24, 2))
    assert not two_hours(at(0, 2, 1))
    assert [m for m in range(1440) if every(1440)(at(0, 0, m))] == [0]
    assert all(every(1)(at(3, h, m)) for h in range(24) for m in range(60))


@pytest.mark.parametrize("minutes", [0, -5, 7, 45, 90, 100, 420, 1441, 2880, 1.5, True, "15"])
def test_every_refuses_a_cadence_that_drifts_across_the_hour_or_the_day(minutes):
    with pytest.raises(ValueError):
        every(minutes)


@pytest.mark.parametrize("minutes", [1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30, 60, 120, 180, 240, 360, 480, 720, 1440])
def test_every_accepts_divisors_of_the_hour_and_hours_that_divide_the_day(minutes):
    assert every(minutes)(at(0, 0, 0))


def test_hourly_and_daily():
    assert [m for m in range(60) if hourly(7)(at(2, 13, m))] == [7]
    assert all(hourly(7)(at(2, h, 7)) for h in range(24))
    cleanup = daily(3, 17)
    assert [(h, m) for h in range(24) for m in range(60) if cleanup(at(4, h, m))] == [(3, 17)]


@pytest.mark.parametrize(
    ("make", "args"), [(hourly, (60,)), (hourly, (-1,)), (daily, (24, 0)), (daily, (0, 60)), (daily, (-1, 0))]
)
def test_out_of_range_cadences_fail_at_construction(make, args):
    with pytest.raises(ValueError):
        make(*args)


def test_weekdays_is_monday_to_friday_and_the_inner_predicate():
    nine = weekdays(daily(9, 0))
    assert [d for d in range(7) if nine(at(d, 9, 0))] == [0, 1, 2, 3, 4]
    assert not nine(at(0, 9, 1))
    with pytest.raises(ValueError):
        weekdays("09:00")  # type: ignore[arg-type]


def test_predicates_read_the_utc_fields_of_an_aware_datetime():
    # 22:17 UTC on Friday is 03:17 on Saturday in UTC+5.
    plus5 = at(4, 22, 17).astimezone(timezone(timedelta(hours=5)))
    assert daily(22, 17)(plus5) and not daily(3, 17)(plus5)
    assert weekdays(hourly(17))(plus5)


def test_floor_minute_and_last_match():
    assert floor_minute(at(0, 3, 17, second=59).replace(microsecond=5)) == at(0, 3, 17)
    with pytest.raises(ValueError):
        floor_minute(datetime(2026, 3, 2, 3, 17))  # naive: which zone?
    assert last_match(daily(3, 17), at(1, 3, 20)) == at(1, 3, 17)
    assert last_match(daily(3, 17), at(1, 3, 17)) == at(0, 3, 17)  # strictly before
    assert last_match(daily(3, 17), at(1, 3, 16)) == at(0, 3, 17)
    assert last_match(every(15), at(0, 10, 14)) == at(0, 10, 0)
    assert last_match(weekdays(daily(9, 0)), at(5, 10, 0)) is None  # Friday 09:00 is over a day back


def test_a_bad_entry_fails_when_the_schedule_is_built():
    with pytest.raises(ValueError):
        Scheduled("", "x.Y", every(5))
    with pytest.raises(ValueError):
        Scheduled("x", " x.Y", every(5))
    with pytest.raises(ValueError):
        Scheduled("x", "x.Y", "*/5 * * * *")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Scheduled("x", "x.Y", every(5), args={"when": datetime.now(UTC)})  # not JSON
    with pytest.raises(ValueError, match=r"more than once: x\.Y"):
        Clock(None, [Scheduled("x", "x.Y", every(5)), Scheduled("x", "x.Y", hourly(3))])  # type: ignore[arg-type]


def test_a_cadence_says_how_it_was_written():
    from lib.background.cron import cron

    assert str(every(15)) == "every(15)"
    assert str(weekdays(daily(9, 0))) == "weekdays(daily(9, 0))"
    assert str(weekdays(hourly(17))) == "weekdays(hourly(17))"
    assert str(weekdays(cron("0 9 * * *", tz="Europe/Paris"))) == "weekdays(cron('0 9 * * *', tz='Europe/Paris'))"

    def first_monday(t):
        return t.day <= 7

    assert str(weekdays(first_monday)) == "weekdays(test_a_cadence_says_how_it_was_written.first_monday)"
