"""When an API says to come back: Retry-After, HTTP dates, epoch seconds and
RFC 3339 resets, each read as an absolute UTC moment and bounded by MAX_WAIT."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import requests

# The longest an API may send us away for. A job snoozed for a century (or a
# Retry-After of inf) is a bug on either side; a day bounds it, and the job
# comes back to ask again.
MAX_WAIT = timedelta(days=1)


def utc_now() -> datetime:
    return datetime.now(UTC)


def clamp_reset(moment: datetime, now: datetime) -> datetime:
    """moment, but not before now and not more than MAX_WAIT after it."""
    return min(max(moment, now), now + MAX_WAIT)


def parse_retry_after(value: str | None, now: datetime) -> datetime | None:
    """Absolute UTC moment from a Retry-After value (delta-seconds or
    HTTP-date), within [now, now + MAX_WAIT]; None when unusable (nan too)."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        if math.isnan(seconds):
            return None
        # Clamped before timedelta sees it: inf and 1e12 overflow it.
        return now + timedelta(seconds=min(max(seconds, 0.0), MAX_WAIT.total_seconds()))
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return clamp_reset(moment.astimezone(UTC), now)


def parse_http_date(value: str | None) -> datetime | None:
    """Absolute UTC moment from an HTTP-date (a Date header); None when unusable."""
    if not value:
        return None
    try:
        moment = parsedate_to_datetime(value.strip())
    except (TypeError, ValueError):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def reset_by_server_clock(reset: datetime, response: requests.Response, now: datetime, minimum: timedelta) -> datetime:
    """When to come back for a reset moment the API gave by its own clock.

    A reset already past by our clock means our clock is ahead of the API's
    (the limit still holds, or the API would not have refused): the wait is
    then the reset less the API's own Date, or the minimum when there is no
    usable Date or the reset is past by the API's clock too. Never now itself.
    """
    if reset > now:
        return reset
    server_now = parse_http_date(response.headers.get("date"))
    if server_now is not None and reset > server_now:
        return now + (reset - server_now)
    return now + minimum


def parse_epoch(value: str | None) -> datetime | None:
    """Absolute UTC moment from a header holding UTC epoch seconds."""
    if not value:
        return None
    try:
        return datetime.fromtimestamp(float(value), UTC)
    except (ValueError, OverflowError, OSError):
        return None


def parse_rfc3339(value: str | None) -> datetime | None:
    """Absolute UTC moment from an RFC 3339 timestamp such as 2030-01-02T03:04:05Z."""
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)
