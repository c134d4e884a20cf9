"""The clock: once a minute, enqueue each scheduled job whose predicate matches
the current UTC minute, by the database's clock (lib/background/db_time.py).

Every worker process runs a clock. An entry fires once per matching minute
however many run, because the statement that enqueues it also records (entry,
minute) in clock_ticks under a primary key; and it does not fire while a copy
of it (same queue, name and args) is still pending, so a slow queue never piles
up copies of its own schedule. An entry is what it enqueues: two entries of one
job name with different args are two entries.

Predicates are pure functions of a UTC datetime, and `tick` takes the minute as
an argument, so tests pass the time in and never sleep.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from gevent.event import Event

from lib.background.db_time import DatabaseTime
from lib.insert import check_name, encode_args
from lib.setup.error_reports import Outage, capture
from lib.store.db import DB
from lib.store.driver_errors import is_database_error, is_outage
from lib.store.sql import Q

log = logging.getLogger("jobs.clock")
# How long one entry's enqueue may wait on a lock another transaction holds.
FIRE_LOCK_TIMEOUT = 2.0

Predicate = Callable[[datetime], bool]

MINUTE = timedelta(minutes=1)
# How far back a catch_up entry looks for the minute it missed.
CATCH_UP_WINDOW = timedelta(hours=24)
# clock_ticks rows older than this are deleted; catch-up reads only the last day.
KEEP_TICKS = timedelta(days=3)
PRUNE_EVERY = timedelta(hours=1)
# How often a loop whose time cannot be read (the database is away) asks again.
TIME_RETRY = 5.0


@dataclass(frozen=True)
class Scheduled:
    """One entry of the schedule: enqueue (queue, name, args) at each minute `at` matches."""

    queue: str
    name: str
    at: Predicate
    args: dict[str, Any] | None = None
    # Fire once, at the first tick after a start, for the most recent matching
    # minute of the last day that no clock acted on.
    catch_up: bool = False

    def __post_init__(self) -> None:
        # A bad entry fails when the schedule is imported, not at 03:17 some night.
        check_name("scheduled queue", self.queue)
        check_name("scheduled name", self.name)
        if not callable(self.at):
            raise ValueError(f"scheduled job {self.name}: at must be a predicate on a UTC datetime")
        encode_args(self.args)

    @property
    def key(self) -> str:
        """What names this entry in clock_ticks: a digest of what it enqueues,
        (queue, name, args), args in a canonical key order. A digest, so the
        table stays small whatever the args."""
        # Imported here: hashlib loads OpenSSL's digests, memory a worker with no schedule has no use for.
        import hashlib

        what = json.dumps([self.queue, self.name, self.args or {}], sort_keys=True, separators=(",", ":"))
        return hashlib.md5(what.encode()).hexdigest()


# Cadences. Each returns a predicate on a UTC datetime; seconds are ignored.


@dataclass(frozen=True)
class Cadence:
    """A predicate one of the makers below made, which says how it was made
    (`every(15)`): the schedule page shows it as it was written."""

    text: str
    at: Predicate

    def __call__(self, t: datetime) -> bool:
        return self.at(t)

    def __str__(self) -> str:
        return self.text


def written(pred: Predicate) -> str:
    """A predicate as the schedule wrote it: a cadence's own text, else the
    function's name."""
    if not hasattr(pred, "__qualname__"):  # a Cadence, a cron entry: they say it themselves
        return str(pred)
    return pred.__qualname__.replace(".<locals>", "")


def _int_in(value: int, low: int, high: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{what} must be an int from {low} to {high}, got {value!r}")
    return value


def _utc(t: datetime) -> datetime:
    return t.astimezone(UTC) if t.tzinfo is not None else t


def every(minutes: int) -> Predicate:
    """Every `minutes` minutes of the UTC day, starting at midnight. It must
    divide an hour, or be whole hours that divide a day, so the gap between two
    runs is the same across the hour and across midnight."""
    _int_in(minutes, 1, 1440, "every(minutes)")
    if 60 % minutes and (minutes % 60 or 1440 % minutes):
        raise ValueError(f"every({minutes}): use a divisor of 60, or a multiple of 60 that divides 1440")

    def at(t: datetime) -> bool:
        t = _utc(t)
        return (t.hour * 60 + t.minute) % minutes == 0

    return Cadence(f"every({minutes})", at)


def hourly(minute: int) -> Predicate:
    """At :MM of every hour."""
    _int_in(minute, 0, 59, "hourly(minute)")
    return Cadence(f"hourly({minute})", lambda t: _utc(t).minute == minute)


def daily(hour: int, minute: int) -> Predicate:
    """At HH:MM UTC every day."""
    _int_in(hour, 0, 23, "daily(hour)")
    _int_in(minute, 0, 59, "daily(minute)")

    def at(t: datetime) -> bool:
        t = _utc(t)
        return t.hour == hour and t.minute == minute

    return Cadence(f"daily({hour}, {minute})", at)


def weekdays(pred: Predicate) -> Predicate:
    """pred, Monday to Friday (UTC) only."""
    if not callable(pred):
        raise ValueError("weekdays(pred): pred must be a predicate on a UTC datetime")
    return Cadence(f"weekdays({written(pred)})", lambda t: _utc(t).weekday() < 5 and pred(t))


def floor_minute(t: datetime) -> datetime:
    """The UTC minute that t falls in. A naive t is refused: its zone is a guess."""
    if t.tzinfo is None:
        raise ValueError("the clock needs a timezone-aware datetime")
    return t.astimezone(UTC).replace(second=0, microsecond=0)


def last_match(at: Predicate, minute: datetime, window: timedelta = CATCH_UP_WINDOW) -> datetime | None:
    """The latest minute before `minute`, and no more than `window` before it, that at matches."""
    earlier = minute - MINUTE
    while earlier >= minute - window:
        if at(earlier):
            return earlier
        earlier -= MINUTE
    return None


def check_schedule(schedule: Iterable[Scheduled]) -> None:
    """ValueError (one line) for a schedule no clock can run: an entry that is
    not a Scheduled, or one listed twice. clock_ticks and the pending check
    key on what an entry enqueues: a second identical entry would be silently
    suppressed by the first."""
    entries = list(schedule)
    for i, entry in enumerate(entries):
        if not isinstance(entry, Scheduled):
            raise ValueError(f"schedule entry {i} is a {type(entry).__name__}, not a Scheduled: {entry!r:.100}")
    seen = Counter(entry.key for entry in entries)
    # pop: an entry listed three times is named once.
    twice = sorted(
        f"{e.name} {json.dumps(e.args or {}, sort_keys=True)} in queue {e.queue}"
        for e in entries
        if seen.pop(e.key, 0) > 1
    )
    if twice:
        raise ValueError(f"the schedule lists these jobs more than once: {', '.join(twice)}")


def each_minute(
    tick: Callable[[datetime], object],
    stop: Event,
    now: Callable[[], datetime],
    what: str,
    *,
    unread: Outage | None = None,
) -> None:
    """tick(minute) at each minute boundary of now()'s time until stop is
    set. A loop that wakes late (a suspended VM, a starved hub) ticks the
    minute it woke in; the minutes between are missed, as if it had been
    down. While now() raises (the database's time cannot be read) nothing
    is ticked: it is asked again every TIME_RETRY seconds, and the run of
    failures is reported once through unread."""
    unread = unread or Outage(f"{what} time")
    last: datetime | None = None  # the minute ticked last, or that the loop started in
    while not stop.is_set():
        try:
            last = last or floor_minute(now())
            minute = _next_minute(last, stop, now, what)
        except Exception as exc:
            if not is_database_error(exc):
                raise  # a bug (or a kill): the supervisor reports it and restarts the part
            unread.failed(exc)
            if stop.wait(TIME_RETRY):
                return
            continue
        unread.recovered()
        if minute is None:
            return
        last = minute
        try:
            tick(minute)
        except Exception as exc:  # a bug in tick itself must not stop the loop
            log.exception("%s tick %s failed", what, minute)
            capture(exc, message=f"{what} tick")


def _next_minute(last: datetime, stop: Event, now: Callable[[], datetime], what: str) -> datetime | None:
    """Wait for the minute after last; the minute to tick (that one, or the
    later one the loop woke in), or None when stop is set first."""
    minute = last + MINUTE
    while (delay := (minute - now()).total_seconds()) > 0:
        if delay > 2 * MINUTE.total_seconds():
            # The time stepped back: wait for the next minute of the new time.
            minute = floor_minute(now()) + MINUTE
            continue
        if stop.wait(delay):
            return None
    woke = floor_minute(now())
    if woke > minute:
        log.warning("%s woke at %s, late for %s; the minutes between are not replayed", what, woke, minute)
        return woke
    return minute


class Clock:
    def __init__(
        self,
        db: DB,
        schedule: Iterable[Scheduled],
        *,
        now: Callable[[], datetime] | None = None,
        outage: Outage | None = None,
    ) -> None:
        """now: the time the clock ticks by, the database's unless given.
        outage: where a run of failures to read it is reported (the worker's
        one report of the database's outage)."""
        self.db = db
        self.schedule = list(schedule)
        # The database's time, not the host's: workers on hosts whose clocks
        # disagree tick the same minute at the same moment.
        self.now = now or DatabaseTime(db)
        self.outage = outage
        check_schedule(self.schedule)
        # Catch-up is owed until it has been checked once; a tick that fails
        # (the database is down at start) leaves it owed for the next tick.
        self._owed = {entry.key for entry in self.schedule if entry.catch_up}
        self._pruned: datetime | None = None

    def run(self, stop: Event) -> None:
        """Tick at each minute boundary until stop is set."""
        each_minute(self.tick, stop, self.now, "clock", unread=self.outage)

    def tick(self, minute: datetime) -> list[int]:
        """Enqueue the entries due at this minute (and owed catch-ups); the ids
        this clock enqueued. One entry's failure is logged and reported, and
        the others still run."""
        minute = floor_minute(minute)
        ids: list[int] = []
        for entry in self.schedule:
            try:
                job_id = self._tick_entry(entry, minute)
            except Exception as exc:
                if is_outage(exc) and self.outage is not None:
                    # The database's (read-only, say): one report for the spell, not one an entry a minute.
                    self.outage.failed(exc)
                    continue
                log.error("clock job=%s queue=%s err: %s", entry.name, entry.queue, exc)
                capture(exc, message="clock job", queue=entry.queue, job=entry.name)
                continue
            if job_id is not None:
                ids.append(job_id)
        self._prune(minute)
        return ids

    def _tick_entry(self, entry: Scheduled, minute: datetime) -> int | None:
        if entry.at(minute):
            self._owed.discard(entry.key)
            return self._fire(entry, minute)
        if entry.key not in self._owed:
            return None
        missed = self._missed(entry, minute)
        job_id = self._fire(entry, missed, catch_up=True) if missed else None
        # Only now: a catch-up that failed is tried again at the next tick.
        self._owed.discard(entry.key)
        return job_id

    def _missed(self, entry: Scheduled, minute: datetime) -> datetime | None:
        """The most recent matching minute of the last day, unless some clock
        already acted on it (or on a later one)."""
        due = last_match(entry.at, minute)
        if due is None:
            return None
        row = self.db.query_row(Q.clock_last_fired, {"name": entry.name, "entry": entry.key})
        last = row[0] if row else None
        return None if last is not None and last >= due else due

    def _fire(self, entry: Scheduled, minute: datetime, *, catch_up: bool = False) -> int | None:
        params = {
            "queue": entry.queue,
            "name": entry.name,
            "args": encode_args(entry.args),
            "entry": entry.key,
            "minute": minute,
            "callsite": f"clock:{entry.name}",
        }
        with self.db.transaction() as tx:
            # One entry whose row another transaction holds (an uncommitted copy
            # of its job, under a dedupe name) fails alone, in time for the rest.
            tx.exec(f"SET LOCAL lock_timeout = {int(FIRE_LOCK_TIMEOUT * 1000)}")
            row = tx.query_row(Q.clock_fire, params)
        ticked, job_id = row if row else (0, None)
        late = f" caught_up={minute:%Y-%m-%dT%H:%MZ}" if catch_up else ""
        if not ticked:
            log.debug("clock job=%s queue=%s: another clock took %s", entry.name, entry.queue, minute)
        elif job_id is None:
            log.info("clock job=%s queue=%s skipped: a copy is still pending%s", entry.name, entry.queue, late)
        else:
            log.info("clock job=%s queue=%s id=%d%s", entry.name, entry.queue, job_id, late)
        return job_id

    def _prune(self, minute: datetime) -> None:
        """Delete old clock_ticks rows about once an hour per process: a small
        delete on a small table."""
        # A clock stepped back (minute before the last prune) prunes too.
        if self._pruned is not None and timedelta(0) <= minute - self._pruned < PRUNE_EVERY:
            return
        # Set first: a prune that fails is tried (and reported) again in an
        # hour, not every minute of an outage.
        self._pruned = minute
        try:
            self.db.exec(Q.clock_prune, {"before": minute - KEEP_TICKS})
        except Exception as exc:
            if is_outage(exc) and self.outage is not None:
                self.outage.failed(exc)
                return
            log.warning("clock could not prune clock_ticks: %s", exc)
            capture(exc, message="clock prune")
