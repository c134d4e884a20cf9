"""The worker's settings, read from the environment once (in worker.main), each
checked when it is read, so a bad value stops the worker with one clear line
instead of a traceback at the first job. A malformed DATABASE_URL is named with
its password masked: the driver's own message may quote it.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from urllib.parse import unquote

from lib.redact import REDACTED, scrub

DEFAULT_SHUTDOWN_WINDOW = 30.0
DEFAULT_LEASE_SECONDS = 30.0
# Loopback: the endpoints (and the admin page) are for the machine itself and
# an SSH tunnel to it, not for the network.
DEFAULT_HTTP_ADDR = ("127.0.0.1", 9400)
# A token short enough to guess would make the constant-time compare pointless.
MIN_ADMIN_TOKEN = 16

# The password of a URL (scheme://user:password@host) or a key/value DSN
# (password=... or password='...'), as written: it may be malformed itself.
_URL = re.compile(r"^[a-z][a-z0-9+.-]*://", re.IGNORECASE)
_QUERY_PASSWORD = re.compile(r"[?&]password=([^&#]*)")
_KV_PASSWORD = re.compile(r"(?:^|\s)password\s*=\s*(?:'(?P<quoted>(?:[^'\\]|\\.)*)'|(?P<bare>\S+))")


# LOG_FORMAT: readable lines, or one JSON object per line (lib/logs.py).
LOG_FORMATS = ("text", "json")
# JOBS_POOLER: what DATABASE_URL points at. A pooler in session mode keeps each
# client's session, so it is the same as none; one in transaction mode does not.
POOLERS = ("none", "session", "transaction")
# How often every queue looks for work when nothing can wake it (no LISTEN).
DEFAULT_POLLING_INTERVAL = 1.0


class SettingError(ValueError):
    """A setting that cannot be used; the message names it and never holds a secret."""


@dataclass(frozen=True)
class Settings:
    database_url: str | None = None  # None: the embedded server
    shutdown_window: float = DEFAULT_SHUTDOWN_WINDOW
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    log_level: str = "INFO"
    log_format: str = "text"  # or "json": one JSON object per line
    http_addr: tuple[str, int] | None = DEFAULT_HTTP_ADDR  # None: no HTTP server
    admin_token: str | None = None  # None: no admin page
    # "transaction": DATABASE_URL is a pooler that gives each transaction any
    # server session, so nothing may rely on a session (lib/db.py, lib/migrate.py).
    pooler: str = "none"
    direct_url: str | None = None  # the server itself, for LISTEN behind such a pooler
    poll_interval: float | None = None  # None: each queue's own, or DEFAULT_POLLING_INTERVAL without LISTEN

    @property
    def pooled(self) -> bool:
        """Whether connections through DATABASE_URL share server sessions."""
        return self.pooler == "transaction"

    def listen_url(self, url: str) -> str | None:
        """Where the LISTEN connection goes, given the URL the pool uses; None:
        nowhere (a transaction pooler cannot hold a LISTEN), so queues poll."""
        return self.direct_url or (None if self.pooled else url)

    def queue_poll_interval(self, listening: bool) -> float | None:
        """Every queue's fallback poll, when it must be shorter than its own."""
        return self.poll_interval if self.poll_interval or listening else DEFAULT_POLLING_INTERVAL

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        url = env.get("DATABASE_URL") or None
        if url is not None:
            check_dsn(url)
        level = env.get("LOG_LEVEL", "INFO").strip().upper() or "INFO"
        if not isinstance(logging.getLevelName(level), int):
            raise SettingError(f"LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL, got {level!r}")
        log_format = env.get("LOG_FORMAT", "text").strip().lower() or "text"
        if log_format not in LOG_FORMATS:
            raise SettingError(f"LOG_FORMAT must be text or json, got {env.get('LOG_FORMAT')!r}")
        pooler = env.get("JOBS_POOLER", "none").strip().lower() or "none"
        if pooler not in POOLERS:
            raise SettingError(f"JOBS_POOLER must be transaction, session or none, got {env.get('JOBS_POOLER')!r}")
        direct_url = env.get("DATABASE_DIRECT_URL") or None
        if direct_url is not None:
            check_dsn(direct_url, "DATABASE_DIRECT_URL")
        poll = env.get("JOBS_POLL_INTERVAL")
        return cls(
            database_url=url,
            shutdown_window=seconds(
                "JOBS_SHUTDOWN_WINDOW", env.get("JOBS_SHUTDOWN_WINDOW"), DEFAULT_SHUTDOWN_WINDOW, low=0
            ),
            lease_seconds=seconds("JOBS_LEASE_SECONDS", env.get("JOBS_LEASE_SECONDS"), DEFAULT_LEASE_SECONDS, low=1),
            log_level=level,
            log_format=log_format,
            http_addr=http_addr(env.get("JOBS_HTTP_ADDR")),
            admin_token=admin_token(env.get("JOBS_ADMIN_TOKEN")),
            pooler=pooler,
            direct_url=direct_url,
            poll_interval=seconds("JOBS_POLL_INTERVAL", poll, 0.0, low=0.05, high=3600.0) if poll else None,
        )

    def __repr__(self) -> str:
        # Every field, the secrets masked: a repr in a log or a Sentry event must not carry them.
        shown = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in ("database_url", "direct_url"):
            shown[name] = masked_dsn(shown[name]) if shown[name] else None
        shown["admin_token"] = REDACTED if self.admin_token else None
        return "Settings(" + ", ".join(f"{name}={value!r}" for name, value in shown.items()) + ")"


def seconds(name: str, text: str | None, default: float, *, low: float, high: float = 86400.0) -> float:
    """A number of seconds from low to high (a day by default); default when unset."""
    if text is None or not text.strip():
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not low <= value <= high:  # NaN fails both
        raise SettingError(f"{name} must be a number of seconds from {low:g} to {high:g}, got {text!r}")
    return value


def http_addr(text: str | None) -> tuple[str, int] | None:
    """JOBS_HTTP_ADDR: host:port ([::1]:port for IPv6), or off; the default when unset."""
    if text is None or not text.strip():
        return DEFAULT_HTTP_ADDR
    text = text.strip()
    if text.lower() == "off":
        return None
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        host = ""  # an IPv6 address without brackets: its port cannot be told apart
    good_host = bool(host) and host.isprintable() and " " not in host
    if not sep or not good_host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise SettingError(f"JOBS_HTTP_ADDR must be host:port (or [v6]:port, or off), got {text!r}")
    return host, int(port)


def admin_token(text: str | None) -> str | None:
    """JOBS_ADMIN_TOKEN: the admin page's token; unset or empty turns the page off."""
    if not text:
        return None
    if len(text) < MIN_ADMIN_TOKEN or not text.isprintable() or text != text.strip():
        # The value is never quoted: it is a secret, and may be one mistyped.
        raise SettingError(
            f"JOBS_ADMIN_TOKEN must be at least {MIN_ADMIN_TOKEN} printable characters without"
            " surrounding spaces (try: openssl rand -hex 32)"
        )
    return text


def dsn_password(dsn: str) -> str | None:
    """The password as written in a DSN (URL or key/value), even a malformed one."""
    url = _URL.match(dsn.strip())
    if url:
        # Up to the last "@": a password may hold "/" or "@" when not encoded.
        rest = dsn.strip()[url.end() :]
        userinfo = rest.rsplit("@", 1)[0] if "@" in rest else ""
        if ":" in userinfo and userinfo.split(":", 1)[1]:
            return userinfo.split(":", 1)[1]
        query = _QUERY_PASSWORD.search(rest)
        return query.group(1) if query else None
    match = _KV_PASSWORD.search(dsn)
    if match:
        return match.group("quoted") or match.group("bare")
    return None


def dsn_secrets(dsn: str) -> list[str]:
    """The password of a DSN as written and percent-decoded: the forms an
    error or a URL may show it in."""
    written = dsn_password(dsn)
    return [written, unquote(written)] if written else []


def mask_secret(text: str, dsn: str) -> str:
    """text with the DSN's password masked."""
    return scrub(text, dsn_secrets(dsn))


def masked_dsn(dsn: str) -> str:
    """The DSN as an operator may see it: the password masked."""
    return mask_secret(dsn, dsn)


def check_dsn(dsn: str, name: str = "DATABASE_URL") -> None:
    """Refuse a DSN the driver cannot parse, naming it (the setting name) with
    the password masked (libpq quotes the bad part, which may be the password itself)."""
    import psycopg2.extensions  # here: lib.errors reads dsn_secrets without a database driver

    try:
        psycopg2.extensions.parse_dsn(dsn)
    except psycopg2.Error as exc:
        reason = mask_secret(str(exc).strip(), dsn)
        raise SettingError(f"{name} is malformed: {reason} (in {masked_dsn(dsn)})") from None
