"""The HTTP client the third-party API clients share: one Session, the
credential kept out of every error, capped bodies, redirects only within the
API's origin, and each error answer turned into a typed error
(lib/clients/api_errors.py) by the client's outcome table
(lib/clients/outcomes.py).

``outcome()`` says what the queue does about an error, ``may_repeat()``
whether a request that got no answer may be sent again, and
``answered_unknown()`` whether an answer says the request may have been
carried out anyway.

Network failures (connection refused, DNS, timeouts) are NOT wrapped: they
propagate as ``requests.RequestException`` subclasses
(``requests.ConnectionError``, ``requests.Timeout``), because no response
exists to classify and they say nothing about the credential.

Nothing here is gevent-specific: once gevent has monkey-patched the socket
module, ``requests`` yields to the hub on I/O by itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import unquote, urljoin, urlsplit

from lib.clients import limits
from lib.clients.api_errors import (
    APIError,
    AuthError,
    BadInputError,
    InvalidArgument,
    NotConfigured,
    NotFoundError,
    OverloadedError,
    RateLimitError,
    ServerError,
    not_sent,
    scrubbed,
)
from lib.clients.outcomes import IDEMPOTENT_METHODS, Outcome, OutcomeTable, table_outcome
from lib.clients.resets import clamp_reset, parse_retry_after, utc_now
from lib.setup.redact import scrub

if TYPE_CHECKING:
    # Imported when a client is built: a worker whose API queues are off
    # (no token) never loads requests and urllib3.
    import requests

log = logging.getLogger(__name__)

MESSAGE_LIMIT = 200
MiB = 1024 * 1024
# Redirects a client that follows them takes, one after another.
MAX_REDIRECTS = 5


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


def read_body(response: requests.Response, cap: int, method: str, path: str) -> None:
    """Read the body into response.content, refusing one over cap bytes
    before it is all in memory."""
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
    OUTCOMES: ClassVar[OutcomeTable] = {401: Outcome.BAD_TOKEN, 404: Outcome.BAD_INPUT, 429: Outcome.RATE_LIMIT}
    # Whether the API documents that a request it answered with an error was
    # not carried out: then even a POST that got a 5xx may be sent again.
    ERROR_ANSWER_MEANS_UNDONE: ClassVar[bool] = False
    # Methods this API carries out the same when sent twice; a client whose
    # GETs spend credits (Apollo's enrichments) names none.
    REPEATABLE_METHODS: ClassVar[frozenset[str]] = IDEMPOTENT_METHODS
    # (connect, read) seconds; each client states its own.
    TIMEOUT: ClassVar[tuple[float, float]] = (5.0, 30.0)
    LIMITS_LEFT: ClassVar[Mapping[str, str]] = {}  # unit -> its header of what is left (limits.py)

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
        """The error an answer with this outcome raises."""
        return self._error_of(outcome, response, method, path, self._message(body, response))

    def _error_of(
        self, outcome: Outcome, response: requests.Response, method: str, path: str, message: str
    ) -> APIError:
        """The error of this outcome, saying message; when a rate limit or a
        transient fault may be tried again, if the answer says."""
        status = response.status_code
        if outcome is Outcome.RATE_LIMIT:
            return RateLimitError(status, method, path, message, reset_at=self._rate_limit_reset(response.headers))
        if outcome is Outcome.TRANSIENT:
            reset_at = parse_retry_after(response.headers.get("retry-after"), self._now())
            return ServerError(status, method, path, message, reset_at=reset_at)
        if outcome is Outcome.BAD_TOKEN:
            return AuthError(status, method, path, message)
        if outcome is Outcome.BAD_INPUT:
            kind = NotFoundError if status == 404 else BadInputError
            return kind(status, method, path, message)
        return APIError(status, method, path, message)

    def _rate_limit_reset(self, headers: Mapping[str, str]) -> datetime | None:
        """When a rate limit lifts, by the answer's headers (an API's own too)."""
        return parse_retry_after(headers.get("retry-after"), self._now())

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
            clean = scrubbed(exc, self._token)
            if clean is exc:
                raise
        # Raised outside the except block, so the original (token and all)
        # is not attached as its __context__.
        raise clean

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
                stream=True,  # read by read_body, which stops at the cap
            )
            with response:
                read_body(response, self.MAX_RESPONSE_BYTES, method, path)
            next_url = self._next_url(response, method, path)
            if next_url is None:
                break
            url, params = next_url, None  # the Location carries its own query
        else:
            raise APIError(response.status_code, method, path, f"more than {MAX_REDIRECTS} redirects")
        log.debug("%s %s -> %s", method, path, response.status_code)
        limits.note(response.headers, self.LIMITS_LEFT)
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
