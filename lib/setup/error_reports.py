"""Error reporting through sentry-sdk: silent without SENTRY_DSN.

Only explicit capture() calls send events. Log records never do: a loop that
logs a failure every cycle must not become eighty events a minute.

sentry-sdk is imported by init(), only when there is somewhere to report to:
with its HTTP transport it is a large part of a worker's memory, which a
worker without SENTRY_DSN has no use for. Until it is imported no client can exist,
so there is nothing to send an event to.

In a worker, sentry-sdk's locks, queue and sending thread are gevent's, and
belong to the hub's thread: a report made in a native thread (the lease
renewal, the hub watch) is handed to that thread (send_through, which
lib/greenlets/reports.py sets up) instead of entering sentry-sdk there.
"""

from __future__ import annotations

import _thread
import contextlib
import logging
import sys
import time
import traceback
from collections.abc import Callable
from functools import partial
from types import ModuleType
from typing import TYPE_CHECKING, Any

from lib.job.text import describe, safe_text
from lib.setup.dsn import dsn_secrets
from lib.setup.redact import scrub

if TYPE_CHECKING:
    from lib.setup.settings import Settings

log = logging.getLogger("jobs.errors")

# The secrets no event, stored traceback or job status may carry: those of the
# settings the process runs with, set by configure() at start (worker.main).
_secrets: list[str] = []


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


def settings_secrets(settings: Settings) -> list[str]:
    """The API tokens, the admin token and the database passwords the settings hold."""
    found = settings.secrets()
    for url in settings.dsns():
        # As written and decoded, even in a DSN no parser accepts.
        found += dsn_secrets(url)
        with contextlib.suppress(Exception):
            # libpq's own reading (escapes in key=value undone). Imported here:
            # this module must import without a database driver.
            from psycopg2.extensions import parse_dsn

            found.append(parse_dsn(url).get("password", ""))
    return [s for s in found if s]


def configure(settings: Settings) -> list[str]:
    """Mask the settings' secrets from now on, in every event, stored
    traceback and job status; returns them, for the log lines' mask (lib.setup.logs)."""
    global _secrets
    _secrets = settings_secrets(settings)
    return list(_secrets)


def configured_secrets() -> list[str]:
    """The secrets configured at start: those of the settings read from the
    environment (configure()); none before."""
    return list(_secrets)


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
    # Read at each event (rare): the secrets configured whether before or after init.
    return mask(event, configured_secrets())


def init(dsn: str | None = None, **options: Any) -> bool:
    """Start reporting to dsn (the settings' SENTRY_DSN); False, and nothing
    imported, without one (unless a test gives its own transport)."""
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
    the exception's message only: locals are never read. Never raises."""
    if exc.__traceback__ is None:
        return None
    try:
        text = "".join(traceback.format_exception(exc))
    except Exception as failure:
        text = f"{describe(exc)}\n(its traceback could not be formatted: {describe(failure)})\n"
    # Kept in a job row, which must hold no secret (a message may quote one),
    # and whose text column takes neither a NUL nor a lone surrogate.
    text = safe_text(scrub(text, configured_secrets()))
    data = text.encode()
    if len(data) <= limit:
        return text
    marker = "(traceback cut to its last lines)\n"
    return marker + data[-(limit - len(marker)) :].decode(errors="ignore")


# Set on an exception that has been reported (or whose report another one
# stands for): capture() sends nothing more for it.
_REPORTED = "_jobs_reported"


def reported(exc: BaseException) -> None:
    """Mark exc as told: capture() of it sends nothing (one report per run of
    failures stands for each of the run's errors)."""
    with contextlib.suppress(AttributeError, TypeError):
        setattr(exc, _REPORTED, True)


# Given each report's send, in the thread that reports: True when it takes the
# send to another thread (the hub's), False when the caller sends it itself.
# None: every report is sent where it is made.
HandOff = Callable[[Callable[[], None]], bool]
_hand_off: HandOff | None = None


def send_through(hand_off: HandOff | None) -> None:
    """From now on, give each report to hand_off before sending it where it
    is made (lib.greenlets.reports); None: send each where it is made."""
    global _hand_off
    _hand_off = hand_off


def _deliver(send: Callable[[], None]) -> None:
    hand_off = _hand_off
    if hand_off is None or not hand_off(send):
        send()


def capture(exc: BaseException, message: str | None = None, **tags: Any) -> None:
    """Report exc with tags (queue, job, id, callsite...), once; never a shutdown."""
    sdk = _sdk()
    if sdk is None or _is_shutdown(exc) or getattr(exc, _REPORTED, False):
        return
    # Marked here, in the caller's thread: a second capture of it while the
    # first waits for the hub's thread sends nothing.
    reported(exc)
    _deliver(partial(_send_exception, sdk, exc, message, tags))


def _send_exception(sdk: ModuleType, exc: BaseException, message: str | None, tags: dict[str, Any]) -> None:
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
    _deliver(partial(_send_message, sdk, message, level, tags))


def _send_message(sdk: ModuleType, message: str, level: str, tags: dict[str, Any]) -> None:
    with sdk.new_scope() as scope:
        for key, value in tags.items():
            scope.set_tag(key, value)
        sdk.capture_message(message, level=level)


def _native_lock() -> _thread.LockType:
    """A lock that blocks the OS thread, also where gevent has patched
    threading: a gevent lock waited on in a native thread would make that
    thread a hub of its own. gevent is not imported here (this layer runs
    without it); a process it patched has gevent.monkey loaded, which keeps
    the original."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is None:
        return _thread.allocate_lock()
    return monkey.get_original("_thread", "allocate_lock")()


# While a run of failures lasts, one line this often says it goes on.
SAY_EVERY = 60.0


class Outage:
    """One report per run of failures of the same thing.

    A database that nobody can reach fails every cycle on every queue; the first
    failure of a run is reported, the rest are counted (one line a minute says
    the run goes on), and the run ends when the thing succeeds again. Share one
    Outage between the parts of a process so an outage of the database is one
    event, not one per queue or part.

    quiet: a success ends the run only once that many seconds have passed
    without a failure. Parts that share an outage meet it differently (while a
    database is read-only its reads succeed and its writes fail; a part that
    ran once in the spell may run again only after it): a success of one part
    while others still fail must not end the run, or a spell is reported again
    at every such turn.

    The hub's greenlets and native threads (the lease renewal) share one, so
    its counts are kept under a native lock, held for the counts alone: never
    across a log line or a report, which may wait.
    """

    def __init__(self, what: str, *, clock: Any = time.monotonic, quiet: float = 0.0) -> None:
        self.what = what
        self._clock = clock
        self.quiet = quiet
        self._lock = _native_lock()
        self._failures = 0
        self._since = 0.0
        self._said = 0.0
        # When the last failure came (the clock's time); None: none yet.
        self.last_failed: float | None = None

    @property
    def failing(self) -> bool:
        """Whether a run of failures lasts: a fault it stands for needs no report of its own."""
        return self._failures > 0

    def failed(self, exc: BaseException, **tags: Any) -> None:
        with self._lock:
            now = self._clock()
            first = self._failures == 0
            if first:
                self._since = self._said = now
            self._failures += 1
            self.last_failed = now
            say = not first and now - self._said >= SAY_EVERY
            if say:
                self._said = now
            failures, since = self._failures, self._since
        if first:
            log.warning("%s failing: %s", self.what, exc)
            capture(exc, message=f"{self.what} failing", **tags)
        elif say:
            log.warning("%s still failing: %d failures over %.0fs, the last: %s", self.what, failures, now - since, exc)

    def recovered(self) -> None:
        with self._lock:
            if not self._failures or (self.last_failed or 0.0) > self._clock() - self.quiet:
                return
            failures, since = self._failures, self._since
            self._failures = 0
        log.warning("%s recovered after %d failures over %.1fs", self.what, failures, self._clock() - since)
