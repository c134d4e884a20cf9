"""Cron strings as cadences: pure functions of the UTC minute passed in,
across both changes of daylight saving time in a European and an American
zone (2026: Paris on 29 March and 25 October, New York on 8 March and
1 November)."""

from datetime import UTC, datetime, timedelta

import pytest

from lib.background.clock import Scheduled, last_match
from lib.background.cron import cron

MINUTE = timedelta(minutes=1)


def fired(expr: str, tz: str, start: datetime, hours: int = 6) -> list[str]:
    """Each UTC minute of `hours` from `start` that the entry fires at, as HH:MM."""
    at = cron(expr, tz=tz)
    minutes = (start + n * MINUTE for n in range(hours * 60))
    return [f"{m:%H:%M}" for m in minutes if at(m)]


def utc(*fields: int) -> datetime:
    return datetime(*fields, tzinfo=UTC)


def test_fields_read_as_debian_cron_reads_them_in_utc_by_default():
    assert fired("*/15 * * * *", "UTC", utc(2026, 6, 1, 10, 0), hours=1) == ["10:00", "10:15", "10:30", "10:45"]
    assert fired("30 */6 * * *", "UTC", utc(2026, 6, 1, 0, 0), hours=24) == ["00:30", "06:30", "12:30", "18:30"]
    weekdays = cron("0 9 * * MON-FRI")
    # 1 June 2026 is a Monday.
    assert [d for d in range(7) if weekdays(utc(2026, 6, 1 + d, 9, 0))] == [0, 1, 2, 3, 4]
    assert not weekdays(utc(2026, 6, 1, 9, 1))
    # Seconds do not matter: the clock's minute is what is asked about.
    assert weekdays(utc(2026, 6, 1, 9, 0) + timedelta(seconds=59))


def test_a_zone_moves_the_utc_minute_with_daylight_saving_time():
    paris = cron("0 9 * * 1-5", tz="Europe/Paris")
    assert paris(utc(2026, 1, 12, 8, 0)) and not paris(utc(2026, 1, 12, 7, 0))  # winter: UTC+1
    assert paris(utc(2026, 7, 13, 7, 0)) and not paris(utc(2026, 7, 13, 8, 0))  # summer: UTC+2
    new_york = cron("0 9 * * *", tz="America/New_York")
    assert new_york(utc(2026, 1, 12, 14, 0)) and new_york(utc(2026, 7, 13, 13, 0))


@pytest.mark.parametrize(
    ("tz", "night_before_utc", "skipped_fires_at"),
    [
        # 02:00 to 02:59 does not exist; 03:00 local is 01:00 UTC in Paris, 07:00 UTC in New York.
        ("Europe/Paris", utc(2026, 3, 28, 23, 0), "01:00"),
        ("America/New_York", utc(2026, 3, 8, 4, 0), "07:00"),
    ],
)
def test_spring_a_time_that_does_not_exist_fires_once_at_the_next_valid_minute(tz, night_before_utc, skipped_fires_at):
    assert fired("30 2 * * *", tz, night_before_utc) == [skipped_fires_at]
    assert fired("0 2 * * *", tz, night_before_utc) == [skipped_fires_at]
    # A time on either side of the gap keeps its own minute.
    before, after = fired("30 1 * * *", tz, night_before_utc), fired("30 3 * * *", tz, night_before_utc)
    assert len(before) == 1 and len(after) == 1 and before != after


@pytest.mark.parametrize(
    ("tz", "night_before_utc", "repeated", "first_utc"),
    [
        # Paris repeats 02:00-02:59 (back from 03:00 CEST); the first 02:30 is 00:30 UTC.
        ("Europe/Paris", utc(2026, 10, 24, 22, 0), "30 2 * * *", "00:30"),
        # New York repeats 01:00-01:59 (back from 02:00 EDT); the first 01:30 is 05:30 UTC.
        ("America/New_York", utc(2026, 11, 1, 3, 0), "30 1 * * *", "05:30"),
    ],
)
def test_autumn_a_time_that_occurs_twice_fires_once(tz, night_before_utc, repeated, first_utc):
    assert fired(repeated, tz, night_before_utc) == [first_utc]


def test_a_wildcard_hour_follows_the_real_clock_across_both_changes():
    # Hourly at :30 in Paris: the skipped hour has no run, the repeated hour its own.
    spring = fired("30 * * * *", "Europe/Paris", utc(2026, 3, 28, 23, 0))
    assert spring == ["23:30", "00:30", "01:30", "02:30", "03:30", "04:30"]
    autumn = fired("30 * * * *", "Europe/Paris", utc(2026, 10, 24, 22, 0))
    assert autumn == ["22:30", "23:30", "00:30", "01:30", "02:30", "03:30"]
    # Every 20 minutes, one run each 20 real minutes through either change.
    for start in (utc(2026, 3, 8, 4, 0), utc(2026, 11, 1, 3, 0)):
        runs = fired("*/20 * * * *", "America/New_York", start)
        assert len(runs) == 18


@pytest.mark.parametrize(
    ("expr", "tz"),
    [
        ("61 * * * *", "UTC"),
        ("* * * *", "UTC"),
        ("* * * * * *", "UTC"),  # seconds are not a field here
        ("0 0 31 2 *", "UTC"),  # no date matches
        ("0 9 * * FUNDAY", "UTC"),
        ("", "UTC"),
        ("0 9 * * *", "Europe/Pariss"),
        ("0 9 * * *", "../etc/passwd"),
    ],
)
def test_a_bad_cron_string_or_zone_fails_at_construction_naming_it(expr, tz):
    with pytest.raises(ValueError, match="cron"):
        cron(expr, tz=tz)


def test_a_cron_entry_is_a_schedule_entry_and_catch_up_finds_its_last_minute():
    entry = Scheduled("caches", "caches.Age", cron("*/15 * * * *"))
    assert entry.at(utc(2026, 6, 1, 10, 45))
    assert last_match(entry.at, utc(2026, 6, 1, 10, 52)) == utc(2026, 6, 1, 10, 45)


def test_a_naive_datetime_is_refused():
    with pytest.raises(ValueError, match="timezone-aware"):
        cron("* * * * *")(datetime(2026, 6, 1, 10, 0))
