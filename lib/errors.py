"""Error reporting through sentry-sdk: silent without SENTRY_DSN.

Only explicit capture() calls send events. Log records never do: a loop that
logs a failure every cycle must not become eighty events a minute.

sentry-sdk is imported by init(), only when there is somewhere to report to:
with its HTTP transport it is about 7 MB of a worker's memory, which a worker
without SENTRY_DSN has no use for. Until it is imported no client can exist,
so there is nothing to send an event to.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
import traceback
from types import ModuleType
from typing import Any

from lib.redact import scrub
from lib.settings import dsn_secrets

log = logging.getLogger("jobs.errors")

# The environment variables whose values no event may carry.
SECRET_ENV = ("GITHUB_TOKEN", "SLACK_BOT_TOKEN", "ANTHROPIC_API_KEY", "APOLLO_API_KEY")
# The database URLs, whose passwords no event or log line may carry either.
DSN_ENV = ("DATABASE_URL", "DATABASE_DIRECT_URL")


def _is_shutdown(exc: BaseException) -> bool:
    # GreenletExit is how gevent cancels a greenlet at shutdown: never a fault.
    # Imported here so this module stays importable without gevent.
    try:
        from greenlet import GreenletExit
    except ImportError:  # pragma: no cover - greenlet ships with gevent
        return False
    return isinstance(exc, GreenletExit | KeyboardInterrupt | SystemExit)


def _drop_shutdown(event: dict[str, Any], hint: dict[str, Any]) -> dict[str, Any] | None:
    exc_info = hint.get("exc_info")
    if exc_info and _is_shutdown(exc_info[1]):
        return None
    return event


def secrets_from_env() -> list[str]:
    """The API tokens and the database password, as configured now."""
    found = [os.environ.get(name, "").strip() for name in SECRET_ENV]
    for url in filter(None, (os.environ.get(name, "") for name in DSN_ENV)):
        # As written and decoded, even in a DSN no parser accepts.
        found += dsn_secrets(url)
        with contextlib.suppress(Exception):
            # libpq's own reading (escapes in key=value undone). Imported here:
            # this module must import without a database driver.
            from psycopg2.extensions import parse_dsn

            found.append(parse_dsn(url).get("password", ""))
    return [s for s in found if s]


def mask(event: Any, secrets: list[str]) -> Any:
    """event with each secret masked in every string it holds, keys included."""
    if isinstance(event, str):
        return scrub(event, secrets)
    if isinstance(event, dict):
        return {mask(key, secrets): mask(value, secrets) for key, value in event.items()}
    if isinstance(event, list | tuple):
        return type(event)(mask(value, secrets) for value in event)
    return event


def _before_send(event: dict[str, Any], hint: dict[str, Any]) -> dict[str, Any] | None:
    if _drop_shutdown(event, hint) is None:
        return None
    # Read at each event (rare), so a secret set after init is masked too.
    return mask(event, secrets_from_env())


def init(dsn: str | None = None, **options: Any) -> bool:
    """Start reporting when a DSN is given or SENTRY_DSN is set; False otherwise."""
    dsn = dsn if dsn is not None else os.environ.get("SENTRY_DSN", "")
    if not dsn and "transport" not in options:
        return False
    import sentry_sdk
    from sentry_sdk.integrations.logging import LoggingIntegration

    sentry_sdk.init(
        dsn=dsn or None,
        # Job args may hold personal data: never attach frame locals (PII stays off by default).
        include_local_variables=False,
        integrations=[LoggingIntegration(level=logging.INFO, event_level=None)],
        # sentry-trace and baggage headers would go out with every API request;
        # third parties have no use for them. Empty: propagate to no host.
        trace_propagation_targets=[],
        before_send=_before_send,
        **options,
    )
    return True


# The traceback kept with a failed job's row (jobs.last_traceback): enough for
# the frames near the fault, bounded so a deep recursion cannot bloat a row.
MAX_TRACEBACK_BYTES = 8 * 1024


def _sdk() -> ModuleType | None:
    """sentry_sdk if it has been imported (by init(), or by a program that set
    it up itself); None: no client exists, and no event can be sent."""
    return sys.modules.get("sentry_sdk")


def reporting() -> bool:
    """Whether events go to Sentry: a client with somewhere to send them (a
    client made without a DSN is active, but sends nothing)."""
    sdk = _sdk()
    if sdk is None:
        return False
    client = sdk.get_client()
    return client.is_active() and client.transport is not None


def traceback_text(exc: BaseException, limit: int = MAX_TRACEBACK_BYTES) -> str | None:
    """exc's traceback as Python prints it, its last `limit` bytes (the fault
    is at the end); None when it was never raised. Frames' source lines and
    the exception's message only: locals are never read."""
    if exc.__traceback__ is None:
        return None
    text = "".join(traceback.format_exception(exc)).replace("\x00", "\\x00")  # Postgres text holds no NUL
    # Kept in a job row, which must hold no secret: a message may quote one.
    text = scrub(text, secrets_from_env())
    data = text.encode()
    if len(data) <= limit:
        return text
    marker = "(traceback cut to its last lines)\n"
    return marker + data[-(limit - len(marker)) :].decode(errors="ignore")


def capture(exc: BaseException, message: str | None = None, **tags: Any) -> None:
    """Report exc with tags (queue, job, id, callsite...); never a shutdown."""
    sdk = _sdk()
    if sdk is None or _is_shutdown(exc):
        return
    with sdk.new_scope() as scope:
        for key, value in tags.items():
            scope.set_tag(key, value)
        if message:
            scope.set_context("what", {"message": message})
        sdk.capture_exception(exc)


def capture_message(message: str, level: str = "error", **tags: Any) -> None:
    """Report something that is not an exception (a blocked hub, say)."""
    sdk = _sdk()
    if sdk is None:
        return
    with sdk.new_scope() as scope:
        for key, value in tags.items():
            scope.set_tag(key, value)
        sdk.capture_message(message, level=level)


class Outage:
    """One report per run of failures of the same thing.

    A database that nobody can reach fails every cycle on every queue; the first
    failure of a run is reported, the rest are counted, and the run ends only
    when the thing succeeds again. Share one Outage between the pollers of a
    process so an outage of the database is one event, not one per queue.
    """

    def __init__(self, what: str, *, clock: Any = time.monotonic) -> None:
        self.what = what
        self._clock = clock
        self._failures = 0
        self._since = 0.0

    def failed(self, exc: BaseException, **tags: Any) -> None:
        if self._failures == 0:
            self._since = self._clock()
            log.warning("%s failing: %s", self.what, exc)
            capture(exc, message=f"{self.what} failing", **tags)
        self._failures += 1

    def recovered(self) -> None:
        if self._failures:
            log.warning(
                "%s recovered after %d failures over %.1fs",
                self.what,
                self._failures,
                self._clock() - self._since,
            )
        self._failures = 0
