"""The parsers of the settings: each reads one variable's text, returns its
value or its default, and refuses a bad one with a SettingError that names
the variable and never quotes a secret. Also the one reading of a duration an
operator types (the CLI's --since, the admin page's ages), which both share
so that each refuses the same slips with the same words."""

from __future__ import annotations

import ipaddress
import logging
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from lib.setup.dsn import URL_SCHEME, mask_secret, masked_dsn

# Loopback: the endpoints (and the admin page) are for the machine itself and
# an SSH tunnel to it, not for the network.
DEFAULT_HTTP_ADDR = ("127.0.0.1", 9400)
# A token short enough to guess would make the constant-time compare pointless.
MIN_ADMIN_TOKEN = 16
# A century: a longer age is a slip, and one far longer overflows the date
# arithmetic of Python (years 1 to 9999) and of Postgres's intervals.
MAX_DURATION_DAYS = 36500


class SettingError(ValueError):
    """A setting that cannot be used; the message names it and never holds a secret."""


# A setting's parser: (its text in the environment, None when unset; the
# variable's name, for the error; the field's default) -> its value.
Parse = Callable[[str | None, str, Any], Any]


def setting(env: str, default: Any, parse: Parse, *, secret: bool = False, dsn: bool = False) -> Any:
    """A field of Settings, read from the variable env by parse. secret: the
    whole value is one (masked in repr, and in every event and log line by
    lib.setup.error_reports); dsn: a database URL, whose password is."""
    return field(default=default, metadata={"env": env, "parse": parse, "secret": secret, "dsn": dsn})


def seconds(text: str | None, name: str, default: Any, *, low: float, high: float = 86400.0) -> Any:
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


def whole(text: str | None, name: str, default: int, *, low: int, high: int, unit: str) -> int:
    """A whole number from low to high; default when unset."""
    if text is None or not text.strip():
        return default
    try:
        value = int(text.strip())
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise SettingError(f"{name} must be a whole number of {unit} from {low} to {high}, got {text!r}")
    return value


_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([smhd])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str) -> float:
    """The seconds of a duration as an operator types it (30s, 15m, 1.5h,
    7d), above 0 and at most MAX_DURATION_DAYS; ValueError, its message
    saying what is wanted, for anything else."""
    match = _DURATION.fullmatch(text.strip())
    # float() never overflows: a number too large for it is inf, refused below.
    seconds = float(match[1]) * _UNIT_SECONDS[match[2]] if match else 0.0
    if not 0 < seconds <= MAX_DURATION_DAYS * 86400:
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise ValueError(f"a duration like 30m, 1h or 2d, above 0 and at most {MAX_DURATION_DAYS}d, got {shown!r}")
    return seconds


def one_of(*choices: str) -> Parse:
    """A parser of one of choices (any case); the default when unset."""

    def parse(text: str | None, name: str, default: Any) -> Any:
        value = (text or "").strip().lower()
        if not value:
            return default
        if value not in choices:
            listed = ", ".join(choices[:-1]) + f" or {choices[-1]}"
            raise SettingError(f"{name} must be {listed}, got {text!r}")
        return value

    return parse


def parse_level(text: str | None, name: str, default: str) -> str:
    level = (text or "").strip().upper() or default
    if not isinstance(logging.getLevelName(level), int):
        raise SettingError(f"{name} must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL, got {level!r}")
    return level


def parse_dsn(text: str | None, name: str, default: str | None) -> str | None:
    """A DSN the driver can parse; default when unset or empty."""
    if not text:
        return default
    check_dsn(text, name)
    return text


def http_addr(
    text: str | None, name: str = "JOBS_HTTP_ADDR", default: tuple[str, int] | None = DEFAULT_HTTP_ADDR
) -> tuple[str, int] | None:
    """JOBS_HTTP_ADDR: host:port ([::1]:port for IPv6), or off; the default when unset."""
    if text is None or not text.strip():
        return default
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
        raise SettingError(f"{name} must be host:port (or [v6]:port, or off), got {text!r}")
    return host, int(port)


def admin_token(text: str | None, name: str = "JOBS_ADMIN_TOKEN", default: str | None = None) -> str | None:
    """JOBS_ADMIN_TOKEN: the admin page's token; unset or empty turns the page off."""
    if not text:
        return default
    if len(text) < MIN_ADMIN_TOKEN or not text.isprintable() or text != text.strip():
        # The value is never quoted: it is a secret, and may be one mistyped.
        raise SettingError(
            f"{name} must be at least {MIN_ADMIN_TOKEN} printable characters without"
            " surrounding spaces (try: openssl rand -hex 32)"
        )
    return text


def parse_queues(text: str | None, name: str, default: frozenset[str] | None) -> frozenset[str] | None:
    """Queue names, comma-separated; unset or blank: every registered queue.
    Whether each is registered is checked once the registry is built."""
    if text is None or not text.strip():
        return default
    names = [part.strip() for part in text.split(",")]
    if not all(names) or not all(n.isprintable() for n in names):
        raise SettingError(f"{name} must be queue names separated by commas, got {text!r}")
    return frozenset(names)


def parse_token(text: str | None, name: str, default: str | None) -> str | None:
    """An API token, its surrounding whitespace dropped (a line break at the
    end of a pasted token); unset or blank: its queue is off. Not checked
    further here: a token no header can carry turns its queue off, with the
    reason, when the worker builds the queue's client (lib/clients/base.py)."""
    return (text or "").strip() or default


def parse_base_url(text: str | None, name: str, default: str | None) -> str | None:
    """An API's base URL (a proxy's, a test server's): https with a host, or
    http to a loopback host only (a token sent in clear text to another host
    is a token given away); unset: the API's own. Checked here, not at the
    first request of each job, where every job would fail on it."""
    value = (text or "").strip()
    if not value:
        return default
    try:
        parts = urlsplit(value)
        # .port raises ValueError for one out of range.
        good = parts.scheme in ("http", "https") and bool(parts.hostname) and (parts.port is None or parts.port > 0)
    except ValueError:
        good = False
    good = good and value.isprintable() and " " not in value
    if not good:
        # A proxy's URL may carry a password: masked, as a database URL's is.
        raise SettingError(f"{name} must be an https:// URL with a host, got {masked_dsn(value)!r}")
    if parts.scheme == "http" and not _loopback(parts.hostname or ""):
        raise SettingError(
            f"{name} must be https:// (http:// only to a loopback host: the token would cross the network"
            f" in clear text), got {masked_dsn(value)!r}"
        )
    return value


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_sentry_dsn(text: str | None, name: str, default: str | None) -> str | None:
    """A Sentry DSN (https://KEY@HOST/PROJECT_ID), checked as sentry-sdk
    would at init (a traceback then) without importing it here: a plain
    program reading the settings (lib.setup.plain_connection) need not load it."""
    value = (text or "").strip()
    if not value:
        return default
    try:
        parts = urlsplit(value)
        port_ok = parts.port is None or parts.port > 0
        project = parts.path.rsplit("/", 1)[-1]
        good = parts.scheme in ("http", "https") and bool(parts.hostname and parts.username) and port_ok
        good = good and project.isdigit()
    except ValueError:
        good = False
    if not good:
        # Not quoted: an old DSN carries a secret key.
        raise SettingError(f"{name} must be a Sentry DSN, https://KEY@HOST/PROJECT_ID (or unset to report nothing)")
    return value


def parse_folder(text: str | None, name: str, default: Path | None) -> Path | None:
    """A folder, relative ones to the working folder; default when unset or empty."""
    return Path(text) if text else default


def check_dsn(dsn: str, name: str = "DATABASE_URL") -> None:
    """Refuse a DSN that can never connect, naming the setting, before any
    connect: one libpq cannot parse (an unknown option included), a port, a
    host or an option value it would refuse only when it connects (where a
    worker would take it for a database that is down). The password is
    masked (libpq quotes the bad part, which may be the password itself), and
    a value that is not a URL at all is not quoted: it may be a password
    pasted into the wrong variable."""
    import psycopg2.extensions  # here: lib.setup.error_reports reads dsn_secrets without a database driver

    is_url = URL_SCHEME.match(dsn.strip()) is not None
    try:
        options = psycopg2.extensions.parse_dsn(dsn)
    except psycopg2.Error as exc:
        if not is_url:
            raise SettingError(
                f"{name} is malformed: neither a postgresql:// URL nor key=value settings"
                " (its value is not shown: it may hold a password)"
            ) from None
        reason = mask_secret(str(exc).strip(), dsn)
        raise SettingError(f"{name} is malformed: {reason} (in {masked_dsn(dsn)})") from None
    problem = _dsn_problem(options)
    if problem:
        raise SettingError(f"{name} {problem}")


# libpq's options whose values it checks only when it connects, with the
# values it takes (libpq 17; an option a libpq does not know fails parse_dsn).
_CHOICES = {
    "sslmode": ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    "gssencmode": ("disable", "prefer", "require"),
    "channel_binding": ("disable", "prefer", "require"),
    "sslnegotiation": ("postgres", "direct"),
    "sslcertmode": ("disable", "allow", "require"),
    "load_balance_hosts": ("disable", "random"),
    "target_session_attrs": ("any", "read-write", "read-only", "primary", "standby", "prefer-standby"),
}


_TLS_VERSIONS = ("TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3")
_WHOLE_OPTIONS = (
    "connect_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
)


# A host name as DNS (and /etc/hosts) can hold one; a socket folder starts with "/" or "@".
_HOST_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_WHOLE = re.compile(r"\s*[+-]?\d+\s*")


def _dsn_problem(options: Mapping[str, str]) -> str | None:
    """What in libpq's reading of a DSN can never connect, as the end of a
    sentence that starts with the setting's name; None: nothing."""
    hosts = options.get("host", "").split(",")
    ports = options.get("port", "").split(",")
    for port in ports:
        if port.strip() and not (port.strip().isdigit() and 1 <= int(port) <= 65535):
            return f"has a bad port {port!r}: a port is a number from 1 to 65535"
    if len(ports) > 1 and len(ports) != len(hosts):
        return f"has {len(ports)} ports for {len(hosts)} hosts: give one port, or one for each host"
    for host in hosts:
        if host and not (host[0] in "/@" or _HOST_NAME.fullmatch(host) or _is_ip(host)):
            return f"has a bad host {host!r}: a host name, an IP address or a socket folder"
    for address in filter(None, options.get("hostaddr", "").split(",")):
        if not _is_ip(address):
            return f"has a bad hostaddr {address!r}: an IP address"
    for key, choices in _CHOICES.items():
        if key in options and options[key] not in choices:
            return f"has a bad {key} {options[key]!r}: one of {', '.join(choices)}"
    for key in ("ssl_min_protocol_version", "ssl_max_protocol_version"):
        if options.get(key) and options[key].lower() not in {v.lower() for v in _TLS_VERSIONS}:
            return f"has a bad {key} {options[key]!r}: one of {', '.join(_TLS_VERSIONS)}"
    for key in _WHOLE_OPTIONS:
        if options.get(key) and not _WHOLE.fullmatch(options[key]):
            return f"has a bad {key} {options[key]!r}: a whole number"
    return None


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
