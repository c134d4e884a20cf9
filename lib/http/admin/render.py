"""What every page of the admin site shares: the templates' environment and
filters, the headers each response carries, and the cookies it sets."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from lib.http.web import Response, redirect
from lib.operate import overview

PREFIX = "/admin"
FLASH = "jobs_admin_flash"
TEMPLATES = Path(__file__).resolve().parent / "templates"


def environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        # Every value is escaped: job names, args and errors are written by whoever enqueues.
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(when=when, ago=ago, left=left, clock=clock, seconds=overview.age, count=count)
    return env


# The page loads nothing from elsewhere, runs only its own nonce'd script
# (which fetches its numbers from this site alone), and cannot be framed (a
# framed page could be clicked through by another site).
def csp(nonce: str) -> str:
    return (
        f"default-src 'none'; style-src 'nonce-{nonce}'; script-src 'nonce-{nonce}'; connect-src 'self'; "
        "img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    )


SECURITY_HEADERS = [
    ("Cache-Control", "no-store"),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
]


def cookie(name: str, value: str, *, max_age: int) -> str:
    # Not Secure: the page is plain HTTP on loopback, reached through an SSH
    # tunnel; a Secure cookie would never be sent back.
    return f"{name}={value}; Path={PREFIX}; Max-Age={max_age}; HttpOnly; SameSite=Strict"


def done(location: str, message: str) -> Response:
    """Back to a page, which shows the message once."""
    return redirect(location, [("Set-Cookie", cookie(FLASH, quote(message[:1000]), max_age=60))])


def present(**values: str | None) -> dict[str, str]:
    return {k: v for k, v in values.items() if v}


def ids_text(ids: list[int]) -> str:
    shown = ", ".join(map(str, ids[:20]))
    return shown + (f" and {len(ids) - 20} more" if len(ids) > 20 else "")


# -- template filters


def when(value: datetime | None) -> str:
    if value is None:
        return ""
    if value.year >= 9999:
        return "until resumed"  # a pause with no end is stored as infinity
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def ago(value: datetime | None) -> str:
    if value is None:
        return ""
    seconds = (datetime.now(UTC) - value).total_seconds()
    if seconds < 0:
        return "in " + overview.age(-seconds)  # a run_at still ahead
    return overview.age(seconds) + " ago"


def left(value: datetime | None) -> str:
    """How long until value, as a pause or a throttle reads: "for 25m", and
    under ten seconds to the tenth ("for 0.4s"): a throttle's wait is often
    shorter than a second."""
    if value is None:
        return ""
    if value.year >= 9999:
        return "until resumed"
    seconds = (value - datetime.now(UTC)).total_seconds()
    if seconds < 10:
        return f"for {max(seconds, 0.0):.1f}s"
    return "for " + overview.age(seconds)


def clock(value: datetime | None) -> str:
    """A moment as a time of day, UTC, to the second (or the date and time when not today)."""
    if value is None:
        return ""
    if value.year >= 9999:
        return "resumed"
    value = value.astimezone(UTC)
    if value.date() != datetime.now(UTC).date():
        return value.strftime("%Y-%m-%d %H:%MZ")
    return value.strftime("%H:%M:%SZ")


def count(value: int | None, cap: int | None = None, about: bool = False) -> str:
    """A count as the page shows it: 12,345; "10,000+" past a cap; "≈ 12,300"
    for an estimate (to three figures: no more are known); "?" when not known."""
    if value is None:
        return "?"
    if about:
        return f"≈ {round(value, 3 - len(str(value))) if value >= 1000 else value:,}"
    if cap is not None and value > cap:
        return f"{cap:,}+"
    return f"{value:,}"
