"""What the admin pages read from a URL or a form to choose rows: text, job
ids and times. A value a page cannot read is refused with BadFilter, whose
text the page shows, before any of it reaches a query: the page answers 400
with its own "bad filter" message, never a 500."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

from lib.setup.parsers import duration

# A filter or search longer than this is no name anyone typed.
MAX_TEXT = 1000
# A job id is a bigint.
MAX_ID = 2**63
# What no query can take: a NUL (Postgres's text holds none, and psycopg2
# refuses to send one), U+FFFD (what the request's decoding made of bytes
# that were not UTF-8) and a lone surrogate (no encoding can send it).
_UNREADABLE = re.compile("[\x00\ufffd\ud800-\udfff]")
# An ISO time ends in a digit, Z or its zone; an age ends in its unit.
_AGE_UNITS = ("s", "m", "h", "d")


class BadFilter(ValueError):
    """A filter or search the page cannot run; its text is shown on the page."""


def readable(values: Mapping[str, str | None]) -> None:
    """BadFilter, naming the first field, when a value is one no query can take."""
    for name, value in values.items():
        if value is None:
            continue
        if len(value) > MAX_TEXT:
            raise BadFilter(f"{name}: at most {MAX_TEXT} characters")
        if not is_text(value):
            raise BadFilter(f"{name}: not text (a NUL character, or bytes that are not UTF-8)")


def is_text(value: str) -> bool:
    """value holds nothing a query cannot take."""
    return _UNREADABLE.search(value) is None


def parse_id(text: str | None) -> int | None:
    """The job id text spells in ASCII digits, else None. Never int() on
    anything else: Unicode digits such as "²" pass str.isdigit and fail int(),
    and thousands of digits fail int() as well."""
    if text is None or not (text.isascii() and text.isdigit()) or len(text) > len(str(MAX_ID)):
        return None
    value = int(text)
    return value if 0 < value < MAX_ID else None


def moment(text: str | None, label: str, now: datetime) -> datetime | None:
    """A time as typed: "2026-01-02 03:04" (UTC unless it says its zone), or
    an age ("15m", "2h", "7d") before now; in UTC, so that no zone Postgres
    refuses (it takes offsets up to 15:59) and no year outside Python's reach
    gets past here."""
    if text is None:
        return None
    if text.endswith(_AGE_UNITS):
        try:
            return now - timedelta(seconds=duration(text))
        except ValueError as exc:
            raise BadFilter(f"{label}: {exc}") from None
    try:
        found = datetime.fromisoformat(text.replace("Z", "+00:00"))
        return (found if found.tzinfo else found.replace(tzinfo=UTC)).astimezone(UTC)
    except (ValueError, OverflowError):
        example = "2026-01-02 03:04 (UTC), or an age such as 15m, 2h, 7d"
        raise BadFilter(f"{label}: {text[:100]!r} is not a time; {example}") from None
