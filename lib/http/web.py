"""The little of WSGI the worker's HTTP endpoints need: a parsed request and a
response to send. Small enough that no framework is worth its dependencies.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import parse_qs

Environ = dict[str, Any]
StartResponse = Callable[..., Any]
App = Callable[[Environ, StartResponse], Iterable[bytes]]

# A form of the admin page is a few short fields; anything larger is refused
# before it is read.
MAX_FORM_BYTES = 64 * 1024


class BadRequest(Exception):
    """The request cannot be read (a body too large, a bad length)."""


@dataclass
class Request:
    environ: Environ

    @property
    def method(self) -> str:
        return str(self.environ.get("REQUEST_METHOD", "GET")).upper()

    @property
    def path(self) -> str:
        return str(self.environ.get("PATH_INFO") or "/")

    def header(self, name: str) -> str | None:
        return self.environ.get("HTTP_" + name.upper().replace("-", "_"))

    @property
    def query(self) -> dict[str, list[str]]:
        return parse_qs(str(self.environ.get("QUERY_STRING", "")))

    def arg(self, name: str) -> str | None:
        """A query parameter, stripped; None when absent or blank."""
        return _first(self.query, name)

    def args(self) -> dict[str, str | None]:
        """Every query parameter, as arg reads it."""
        query = self.query
        return {name: _first(query, name) for name in query}

    def cookie(self, name: str) -> str | None:
        try:
            morsel = SimpleCookie(self.header("Cookie") or "").get(name)
        except CookieError:
            return None
        return morsel.value if morsel is not None else None

    def form(self) -> dict[str, list[str]]:
        """The urlencoded body of a POST, read once."""
        cached = self.environ.get("jobs.form")
        if cached is not None:
            return cached
        try:
            length = int(self.environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            raise BadRequest("bad Content-Length") from None
        if not 0 <= length <= MAX_FORM_BYTES:
            raise BadRequest(f"a form is at most {MAX_FORM_BYTES} bytes")
        body = self.environ["wsgi.input"].read(length) if length else b""
        form = parse_qs(body.decode("utf-8", "replace"))
        self.environ["jobs.form"] = form
        return form

    def field(self, name: str) -> str | None:
        return _first(self.form(), name)


def _first(values: dict[str, list[str]], name: str) -> str | None:
    found = values.get(name)
    if not found:
        return None
    return found[0].strip() or None


@dataclass
class Response:
    status: int = 200
    body: bytes | str = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: list[tuple[str, str]] = field(default_factory=list)

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        body = self.body.encode() if isinstance(self.body, str) else self.body
        phrase = HTTPStatus(self.status).phrase
        headers = [("Content-Type", self.content_type), ("Content-Length", str(len(body))), *self.headers]
        start_response(f"{self.status} {phrase}", headers)
        return [] if environ.get("REQUEST_METHOD") == "HEAD" else [body]


def text(status: int, line: str) -> Response:
    """A one-line plain-text answer."""
    return Response(status, line.rstrip("\n") + "\n")


def redirect(location: str, headers: list[tuple[str, str]] | None = None) -> Response:
    """See Other: after a POST the browser GETs the page, so a reload never repeats the action."""
    return Response(303, b"", headers=[("Location", location), *(headers or [])])
