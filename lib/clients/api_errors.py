"""The typed errors the API clients raise, and what a failure without an
answer says about the request.

Each client turns the statuses it does not handle into one of these, so job
code can decide retry/stop/fail without knowing the API:

- ``AuthError``: the credential was rejected; retrying will not help.
- ``RateLimitError``: slow down; ``reset_at`` says when, if the API said.
- ``BadInputError`` (``NotFoundError``): the request cannot succeed as sent.
- ``ServerError``: the API failed; usually worth retrying later.
- ``APIError``: anything else (bad request, forbidden resource, ...).
"""

from __future__ import annotations

from datetime import datetime

from lib.setup.redact import carries, scrub


class NotConfigured(Exception):
    """The credential for a client is missing or unusable; the message names
    its setting (the environment variable), never the credential."""


class InvalidArgument(ValueError):
    """A value the client will not put in a request (a GitHub login with a
    slash, a path with a '..' segment); nothing was sent. The job's input is
    at fault, not the worker or the API."""


class APIError(Exception):
    """The API answered with an error the caller should not blindly retry."""

    def __init__(self, status: int, method: str, path: str, message: str, *, reset_at: datetime | None = None) -> None:
        self.status = status
        self.method = method
        self.path = path
        self.message = message
        # When the API said to come back (rate limits, overload); None otherwise.
        self.reset_at = reset_at
        super().__init__(f"{method} {path} -> {status}: {message}")


class BadInputError(APIError):
    """The API refused the request as sent (malformed, too large, no such
    resource): a retry sends the same request and gets the same answer."""


class NotFoundError(BadInputError):
    """404: the resource does not exist (or is hidden from this credential)."""


class AuthError(APIError):
    """The credential was rejected (invalid, revoked, expired)."""


class RateLimitError(APIError):
    """Rate limited; ``reset_at`` is when to try again (UTC), if the API
    said. A limit met again and again is waited out longer each time, and
    given up on (lib/run/api_queue.py, RATE_LIMIT_BUDGET)."""


class ServerError(APIError):
    """The API failed on its side (5xx)."""


class OverloadedError(ServerError):
    """The API is overloaded for everyone (Anthropic's 529), not a quota of ours.

    A ServerError rather than a RateLimitError because slowing down our own
    traffic does not fix it; ``reset_at`` is set only if retry-after was sent.
    """


class OutcomeUnknown(Exception):
    """A request that is not safe to send twice (it posts, it spends credits)
    was sent and no answer came back: it may have been carried out. Not
    retried; the job ends with this for a person to look at."""

    # Read by the poller: the job ends with this error though attempts remain.
    final = True


def not_sent(exc: BaseException) -> bool:
    """Whether exc proves the request never reached the server: the
    connection was refused, its name did not resolve, or connecting timed out."""
    import requests
    from urllib3.exceptions import NewConnectionError

    if isinstance(exc, requests.ConnectTimeout):
        return True
    if not isinstance(exc, requests.ConnectionError):
        return False
    for link in _chain(exc):
        for part in (link, getattr(link, "reason", None), *link.args):
            if isinstance(part, NewConnectionError) or isinstance(getattr(part, "reason", None), NewConnectionError):
                return True
    return False


def _chain(exc: BaseException) -> list[BaseException]:
    """exc and every exception it chains, as a traceback or Sentry shows them."""
    seen: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is not None and all(current is not e for e in seen):
            seen.append(current)
            todo += [current.__cause__, current.__context__]
    return seen


def scrubbed(exc: Exception, secret: str) -> Exception:
    """exc itself when neither it nor what it chains shows secret, else an
    exception of the same kind whose text has secret redacted and that
    chains nothing."""
    chain = _chain(exc)
    if not any(carries(text, [secret]) for e in chain for text in (str(e), repr(e))):
        return exc
    if isinstance(exc, APIError):
        # Ours: every part of its text can be cleaned in place.
        exc.message = scrub(exc.message, [secret])
        exc.path = scrub(exc.path, [secret])
        exc.args = (f"{exc.method} {exc.path} -> {exc.status}: {exc.message}",)
        exc.__cause__ = exc.__context__ = None
        exc.__suppress_context__ = True
        return exc
    text = scrub(str(exc), [secret])
    try:
        clean = type(exc)(text)
    except Exception:
        clean = None
    if clean is None or carries(str(clean), [secret]):
        # A kind that cannot be built from its message alone: say it was
        # a request failure, which every caller already handles.
        import requests

        clean = requests.RequestException(f"{type(exc).__name__}: {text}")
    clean.__suppress_context__ = True
    return clean
