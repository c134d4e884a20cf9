"""Cron strings as the clock's cadences: `cron("*/15 * * * *")`,
`cron("0 9 * * 1-5", tz="Europe/Paris")`. Like every cadence, a predicate
on the clock's UTC minute, so an entry fires once per matching minute across
replicas (clock_ticks) and tests pass the time in.

The five fields are Debian cron's (minute, hour, day of month, month, day of
week; ranges, steps, lists, names such as MON or JAN), read by cronsim, whose
rules for daylight saving time are Debian cron's too. The zone's rules are
zoneinfo's. An entry at a fixed time of day (its minute and hour fields
both fixed) that does not exist on a day, in the hour skipped in spring,
fires once, at the first minute after the gap; one that occurs twice, in the
hour repeated in autumn, fires once, the first time. An entry whose minute
or hour is a wildcard (`30 * * * *`, `*/20 * * * *`) follows the real
clock: the skipped hour has no runs and the repeated one has its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from lib.background.clock import floor_minute

MINUTE = timedelta(minutes=1)


@dataclass(frozen=True)
class Cron:
    """A cron cadence: the predicate, with the string and zone it was built
    from, so a reader of the schedule (the admin page) can list its runs
    from cronsim instead of asking the predicate minute by minute."""

    expr: str
    tz: str

    def __call__(self, t: datetime) -> bool:
        # The entry's next run after the minute before this one is this minute:
        # cronsim decides the runs a gap or a repeated hour moves or drops.
        minute = floor_minute(t)
        return next(self.runs(minute - MINUTE)) == minute

    def __str__(self) -> str:
        return f"cron({self.expr!r})" if self.tz == "UTC" else f"cron({self.expr!r}, tz={self.tz!r})"

    def runs(self, after: datetime) -> Iterator[datetime]:
        """The UTC minutes the entry fires at after `after`, in order: the
        minutes this predicate matches."""
        for run in CronSim(self.expr, after.astimezone(ZoneInfo(self.tz))):
            yield run.astimezone(UTC)


def cron(expr: str, tz: str = "UTC") -> Cron:
    """The minutes `expr` names in the zone `tz` (an IANA name). ValueError,
    naming the string, for one that is not five cron fields or that no
    date can match, and for a zone zoneinfo does not know."""
    if not isinstance(expr, str) or len(expr.split()) != 5:
        raise ValueError(f"cron({expr!r}): five fields are needed: minute hour day-of-month month day-of-week")
    try:
        zone = ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, TypeError) as exc:
        raise ValueError(f"cron({expr!r}, tz={tz!r}): no such time zone") from exc
    try:
        next(CronSim(expr, datetime.now(zone)))
    except (CronSimError, StopIteration) as exc:
        raise ValueError(f"cron({expr!r}): {exc or 'no date matches it'}") from None
    return Cron(expr, tz)
