"""Shared plumbing for the third-party HTTP API clients.

Each client turns the statuses it does not handle into one of the typed errors
below, so job code can decide retry/stop/fail without knowing the API:

- ``AuthError``: the credential was rejected; retrying will not help.
- ``RateLimitError``: slow down; ``reset_at`` says when, if the API said.
- ``BadInputError`` (``NotFoundError``): the request cannot succeed as sent.
- ``ServerError``: the API failed; usually worth retrying later.
- ``APIError``: anything else (bad request, forbidden resource, ...).

Which of these an answer becomes is each client's ``OUTCOMES`` table (status,
or status and the API's error code, to an ``Outcome``); ``outcome()`` says
what the queue does about an error, ``may_repeat()`` whether a request
that got no answer may be sent again, and ``answered_unknown()`` whether an
answer says the request may have been carried out anyway. ``table_text()``
renders a table for a queue's docstring.

Network failures (connection refused, DNS, timeouts) are NOT wrapped: they
propagate as ``requests.RequestException`` subclasses
(``requests.ConnectionError``, ``requests.Timeout``), because no response
exists to classify and they say nothing about the credential.

Nothing here is gevent-specific: once gevent has monkey-patched the socket
module, ``requests`` yields to the hub on I/O by itself.
"""

from __future__ import annotations

import logging
import math
import textwrap
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import unquote, urljoin, urlsplit

from lib.setup.redact import carries, scrub

if TYPE_CHECKING:
    # Imported when a client is built: a worker whose API queues are off
    # (no token) never loads requests and urllib3, several MB of its memory.
    import requests

log = logging.getLogger(__name__)

MESSAGE_LIMIT = 200
MiB = 1024 * 1024
# The longest an API may send us away for. A job snoozed for a century (or a
# Retry-After of inf) is a bug on either side; a day bounds it, and the job
# comes back to ask again.
MAX_WAIT = timedelta(days=1)
# Redirects a client that follows them takes, one after another.
MAX_REDIRECTS = 5


def utc_now() -> datetime:
    return datetime.now(UTC)


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


class Outcome(StrEnum):
    """What a queue does about an API's answer (lib/run/api_queue.py)."""

    RATE_LIMIT = "rate_limit"  # snooze the job until the limit resets
    BAD_TOKEN = "bad_token"  # pause the queue for an hour, one report
    BAD_INPUT = "bad_input"  # fail: no report, no retry
    TRANSIENT = "transient"  # retry with backoff, counted, one report per run
    FAULT = "fault"  # err, reported


# A table's key: a status, or a status and the API's error code (the more
# specific one wins).
OutcomeKey = int | tuple[int, str]
OutcomeTable = Mapping[OutcomeKey, Outcome]

# Methods HTTP defines as idempotent: sent twice, they do what once does.
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})


def table_outcome(table: OutcomeTable, status: int, code: str | None = None) -> Outcome:
    """The outcome table says for status (and code); a status not in it is
    transient from 500 up, a fault below."""
    if code is not None and (status, code) in table:
        return table[(status, code)]
    if status in table:
        return table[status]
    return Outcome.TRANSIENT if status >= 500 else Outcome.FAULT


def table_text(table: Mapping[Any, Outcome]) -> str:
    """table as the lines a queue's docstring shows: each outcome, its keys."""
    lines: list[str] = []
    for outcome in Outcome:
        keys = ", ".join(str(key) for key, o in table.items() if o is outcome)
        if keys:
            lines += textwrap.wrap(f"- {outcome}: {keys}", 79, subsequent_indent="  ", break_on_hyphens=False)
    return "\n".join(lines)


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


def _checked_token(token: str, name: str) -> str:
    """token, when every character of it can go in an HTTP header as is.

    A token pasted with a line break (or any whitespace or control character)
    makes requests refuse every request with an error that quotes the header,
    token included; refused here, its queue is off from the start with a
    reason that names the variable and the character, never the token.
    Non-ASCII is refused too: no API here issues it, and http.client cannot
    send most of it.
    """
    for char in token:
        if not "!" <= char <= "~":
            raise NotConfigured(
                f"{name} holds U+{ord(char):04X}, a whitespace, control or non-ASCII character "
                "no token has (pasted with a line break?)"
            )
    return token


def _origin(url: str) -> tuple[str, str | None, int | None]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, parts.hostname, parts.port or {"http": 80, "https": 443}.get(scheme)


def _size(n: int) -> str:
    return f"{n // MiB} MiB" if n % MiB == 0 else f"{n} bytes"


def check_path(path: str) -> None:
    """Refuse a path the server (or urllib3 before it) would resolve into
    another one: a '.' or '..' segment, spelled out or percent-encoded, an
    empty segment, or a segment that decodes to a slash or backslash.

    Each client quotes what it puts in a path, but quoting keeps '..', and
    /repos/../user is sent as GET /user, with the token.
    """
    route = path.split("?", 1)[0]
    if not route.startswith("/"):
        raise InvalidArgument(f"path {route!r:.100} does not start with /")
    for segment in route[1:].split("/"):
        name = unquote(segment)
        if name in ("", ".", "..") or "/" in name or "\\" in name:
            raise InvalidArgument(f"path {route!r:.100} has an empty, '.', '..' or slashed segment")


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


def extract_message(body: Any, text: str) -> str:
    """The API's own error message if the body carries one, else a body excerpt.

    Covers the shapes used by the APIs here: {"message": ...} (GitHub),
    {"error": "code"} (Slack, Apollo), {"error": {"message": ...}} (Anthropic).
    """
    if isinstance(body, Mapping):
        error = body.get("error")
        if isinstance(error, Mapping) and isinstance(error.get("message"), str):
            return error["message"][:MESSAGE_LIMIT]
        for key in ("message", "error"):
            if isinstance(body.get(key), str) and body[key]:
                return body[key][:MESSAGE_LIMIT]
    excerpt = " ".join(text.split())
    return excerpt[:MESSAGE_LIMIT] or "(empty body)"


class APIClient:
    """Base for one API: credential and base URL from arguments (the worker's
    settings, lib/setup/settings.py, through queues.registry), one Session, typed errors.

    Subclasses set TOKEN_ENV, BASE_URL and BASE_URL_ENV, add their headers in
    ``_headers`` and map their API's error signals in ``_classify``.
    """

    # The settings the token and the base URL come from, by their variables'
    # names: what an error names. The clients never read the environment.
    TOKEN_ENV: ClassVar[str]
    BASE_URL: ClassVar[str]  # the API's own, when no base_url is given
    BASE_URL_ENV: ClassVar[str]
    USER_AGENT: ClassVar[str] = "jobs-worker"
    # requests only strips the Authorization header when a redirect leaves the
    # host, so a key sent in a custom header (x-api-key) would follow a
    # redirect anywhere, and even without a key, the other host's answer would
    # be taken for the API's. So requests never follows one; a client that
    # opts in follows GET redirects within the API's own origin (_next_url),
    # and any other redirect is an error.
    FOLLOW_REDIRECTS: ClassVar[bool] = False
    # No answer these APIs give is near this; a larger one is a fault (or an
    # attack) that must not take the worker's memory. Counted decompressed.
    MAX_RESPONSE_BYTES: ClassVar[int] = 10 * MiB
    # Generic HTTP: what an answer means when the API's own table says no more.
    OUTCOMES: ClassVar[OutcomeTable] = {
        401: Outcome.BAD_TOKEN,
        404: Outcome.BAD_INPUT,
        429: Outcome.RATE_LIMIT,
    }
    # Whether the API documents that a request it answered with an error was
    # not carried out: then even a POST that got a 5xx may be sent again.
    ERROR_ANSWER_MEANS_UNDONE: ClassVar[bool] = False
    # Methods this API carries out the same when sent twice; a client whose
    # GETs spend credits (Apollo's enrichments) names none.
    REPEATABLE_METHODS: ClassVar[frozenset[str]] = IDEMPOTENT_METHODS
    # (connect, read) seconds; each client states its own.
    TIMEOUT: ClassVar[tuple[float, float]] = (5.0, 30.0)

    def __init__(
        self,
        token: str | None = None,
        *,
        base_url: str | None = None,
        timeout: tuple[float, float] | None = None,
        session: requests.Session | None = None,
        now: Callable[[], datetime] = utc_now,
    ) -> None:
        token = (token or "").strip()
        if not token:
            raise NotConfigured(f"{self.TOKEN_ENV} is not set")
        self._token = _checked_token(token, self.TOKEN_ENV)
        self.base_url = (base_url or self.BASE_URL).rstrip("/")
        self.timeout = timeout or self.TIMEOUT
        self._owns_session = session is None
        if session is None:
            import requests

            session = requests.Session()
        self.session = session
        self._now = now

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={self.base_url!r})"

    def close(self) -> None:
        """Release pooled connections; a session passed in belongs to the caller."""
        if self._owns_session:
            self.session.close()

    def _headers(self) -> dict[str, str]:
        """Per-request headers, credential included.

        Kept off ``session.headers`` so a session shared between clients never
        carries one API's credential to another.
        """
        return {"User-Agent": self.USER_AGENT}

    def _classify(self, response: requests.Response, body: Any, method: str, path: str) -> APIError | None:
        """The error this response represents, or None if it is a success.

        Generic HTTP semantics; subclasses override with their API's signals
        and fall back to this.
        """
        status = response.status_code
        if 200 <= status < 300:
            return None
        message = self._message(body, response)
        if 300 <= status < 400:
            return APIError(status, method, path, f"redirect not followed: {message}")
        return self._error(table_outcome(self.OUTCOMES, status, self._error_code(body)), response, body, method, path)

    def _error_code(self, body: Any) -> str | None:
        """The API's own error code in an error body, for the OUTCOMES table."""
        return None

    def _error(self, outcome: Outcome, response: requests.Response, body: Any, method: str, path: str) -> APIError:
        """The error an answer with this outcome raises; retry-after, when
        sent, says when a rate limit or a transient fault may be tried again."""
        status, message = response.status_code, self._message(body, response)
        if outcome is Outcome.RATE_LIMIT:
            reset_at = parse_retry_after(response.headers.get("retry-after"), self._now())
            return RateLimitError(status, method, path, message, reset_at=reset_at)
        if outcome is Outcome.TRANSIENT:
            reset_at = parse_retry_after(response.headers.get("retry-after"), self._now())
            return ServerError(status, method, path, message, reset_at=reset_at)
        if outcome is Outcome.BAD_TOKEN:
            return AuthError(status, method, path, message)
        if outcome is Outcome.BAD_INPUT:
            kind = NotFoundError if status == 404 else BadInputError
            return kind(status, method, path, message)
        return APIError(status, method, path, message)

    def outcome(self, exc: BaseException) -> Outcome | None:
        """What a queue does about an error this client raised; None for
        anything that is not an answer of the API (a bug, a network failure:
        see may_repeat)."""
        if isinstance(exc, InvalidArgument | BadInputError):
            return Outcome.BAD_INPUT
        if isinstance(exc, RateLimitError | OverloadedError):
            return Outcome.RATE_LIMIT
        if isinstance(exc, AuthError):
            return Outcome.BAD_TOKEN
        if isinstance(exc, ServerError):
            # One that may have been carried out is answered_unknown's.
            return Outcome.TRANSIENT
        if isinstance(exc, APIError):
            return Outcome.FAULT
        return None

    def may_repeat(self, exc: BaseException) -> bool:
        """Whether a request that failed with exc (no answer) may be sent
        again: it never reached the API, or sending it twice does what once
        does. Anything else may have been carried out."""
        if not_sent(exc):
            return True
        request = getattr(exc, "request", None)
        return getattr(request, "method", None) in self.REPEATABLE_METHODS

    def answered_unknown(self, exc: BaseException) -> bool:
        """Whether exc is an answer that itself says the request may have
        been carried out, in part or whole: the queue ends the job
        OutcomeUnknown rather than send it again. A server that failed may
        have carried a POST out before it did, unless the API says not."""
        return (
            isinstance(exc, ServerError)
            and exc.method not in self.REPEATABLE_METHODS
            and not self.ERROR_ANSWER_MEANS_UNDONE
        )

    def _message(self, body: Any, response: requests.Response) -> str:
        # An API could echo the credential back (e.g. "invalid key sk-..."):
        # scrub it so it cannot reach logs through str(error).
        return scrub(extract_message(body, response.text), [self._token])

    def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str] | None = None,
    ) -> Any:
        """Send one request and return the decoded JSON body, or raise APIError.

        ``path`` is appended to the base URL; query values belong in ``params``.
        No exception leaves here with the token in its text: what the caller
        raises becomes a job's status, a log line and a Sentry event.
        """
        try:
            return self._send(method, path, json=json, params=params)
        except Exception as exc:
            clean = self._scrubbed(exc)
            if clean is exc:
                raise
        # Raised outside the except block, so the original (token and all)
        # is not attached as its __context__.
        raise clean

    def _scrubbed(self, exc: Exception) -> Exception:
        """exc itself when neither it nor what it chains shows the token, else
        an exception of the same kind whose text has the token redacted and
        that chains nothing."""
        chain = _chain(exc)
        if not any(carries(text, [self._token]) for e in chain for text in (str(e), repr(e))):
            return exc
        if isinstance(exc, APIError):
            # Ours: every part of its text can be cleaned in place.
            exc.message = scrub(exc.message, [self._token])
            exc.path = scrub(exc.path, [self._token])
            exc.args = (f"{exc.method} {exc.path} -> {exc.status}: {exc.message}",)
            exc.__cause__ = exc.__context__ = None
            exc.__suppress_context__ = True
            return exc
        text = scrub(str(exc), [self._token])
        try:
            clean = type(exc)(text)
        except Exception:
            clean = None
        if clean is None or carries(str(clean), [self._token]):
            # A kind that cannot be built from its message alone: say it was
            # a request failure, which every caller already handles.
            import requests

            clean = requests.RequestException(f"{type(exc).__name__}: {text}")
        clean.__suppress_context__ = True
        return clean

    def _read_body(self, response: requests.Response, method: str, path: str) -> None:
        """Read the body into response.content, refusing one over the cap
        before it is all in memory."""
        cap = self.MAX_RESPONSE_BYTES
        too_large = APIError(response.status_code, method, path, f"response body larger than {_size(cap)}")
        declared = response.headers.get("content-length", "").strip()
        # Said up front only when not compressed: the cap counts what decompresses.
        if declared.isdigit() and int(declared) > cap and not response.headers.get("content-encoding"):
            raise too_large
        chunks, size = [], 0
        for chunk in response.iter_content(64 * 1024):
            size += len(chunk)
            if size > cap:
                raise too_large
            chunks.append(chunk)
        # Where requests keeps a body it read itself, so .content, .text and
        # .json() work as usual for _classify.
        response._content = b"".join(chunks)

    def _next_url(self, response: requests.Response, method: str, path: str) -> str | None:
        """Where to follow this response to; None when it is not a redirect
        this client follows (_classify then makes it an error)."""
        if not (self.FOLLOW_REDIRECTS and response.is_redirect and method in ("GET", "HEAD")):
            return None
        target = urljoin(response.url, self.session.get_redirect_target(response))
        if _origin(target) != _origin(self.base_url):
            host = urlsplit(target).hostname or "?"
            raise APIError(response.status_code, method, path, f"redirect to another host ({host}) refused")
        return target

    def _send(
        self,
        method: str,
        path: str,
        *,
        json: Any,
        params: Mapping[str, str] | None,
    ) -> Any:
        check_path(path)
        url = self.base_url + path
        # Errors and logs name the path only: a query string may carry data
        # that has no business in logs.
        path = path.split("?", 1)[0]
        for _ in range(MAX_REDIRECTS + 1):
            response = self.session.request(
                method,
                url,
                json=json,
                params=params,
                headers=self._headers(),
                timeout=self.timeout,
                allow_redirects=False,  # see FOLLOW_REDIRECTS
                stream=True,  # read by _read_body, which stops at the cap
            )
            with response:
                self._read_body(response, method, path)
            next_url = self._next_url(response, method, path)
            if next_url is None:
                break
            url, params = next_url, None  # the Location carries its own query
        else:
            raise APIError(response.status_code, method, path, f"more than {MAX_REDIRECTS} redirects")
        log.debug("%s %s -> %s", method, path, response.status_code)
        try:
            body = response.json() if response.content else None
        except ValueError:
            body = None
        error = self._classify(response, body, method, path)
        if error is not None:
            if error.reset_at is not None:
                # Whichever header it came from (epoch, RFC 3339, a window).
                error.reset_at = clamp_reset(error.reset_at, self._now())
            raise error
        if body is None:
            raise APIError(
                response.status_code,
                method,
                path,
                "expected a JSON body, got: " + self._message(None, response),
            )
        return body
