"""A scriptable fake API on loopback for the client tests.

A real ThreadingHTTPServer in a background thread (a greenlet once gevent has
patched everything), so the clients exercise their real requests/urllib3 path.
Each test queues canned responses and then inspects the requests received.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

# Fixed clock injected into clients so reset_at values are exact.
NOW = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
# Distinctive so a leak into repr() or an error message is easy to detect.
TOKEN = "tok-SECRET-0123456789abcdef"


@dataclass
class Canned:
    status: int = 200
    body: Any = None  # dict/list -> JSON; str/bytes sent as-is
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    # False: no Content-Length; the body ends when the connection closes.
    length: bool = True


@dataclass
class Received:
    method: str
    target: str
    headers: dict[str, str]  # lower-cased names
    body: bytes
    at: float = field(default_factory=time.monotonic)  # when it arrived

    @property
    def path(self) -> str:
        return urlsplit(self.target).path

    @property
    def query(self) -> dict[str, list[str]]:
        return parse_qs(urlsplit(self.target).query)

    def json(self) -> Any:
        return json.loads(self.body)


class FakeAPI:
    def __init__(self, url: str) -> None:
        self.url = url
        self.canned: deque[Canned] = deque()
        self.received: list[Received] = []
        # The Date header this server sends (its clock), when set; else the
        # real time, as http.server sends.
        self.date: datetime | None = None

    def reply(
        self,
        status: int = 200,
        body: Any = None,
        headers: dict[str, str] | None = None,
        delay: float = 0.0,
        length: bool = True,
    ) -> None:
        self.canned.append(Canned(status, body, headers or {}, delay, length))

    @property
    def last(self) -> Received:
        assert self.received, "the fake API received no request"
        return self.received[-1]


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        api = self.server.api
        api.received.append(
            Received(
                self.command,
                self.path,
                {k.lower(): v for k, v in self.headers.items()},
                body,
            )
        )
        canned = api.canned.popleft() if api.canned else Canned(599, {"message": "no canned reply"})
        if canned.delay:
            time.sleep(canned.delay)
        if isinstance(canned.body, bytes):
            payload = canned.body
        elif isinstance(canned.body, str):
            payload = canned.body.encode()
        elif canned.body is None:
            payload = b""
        else:
            payload = json.dumps(canned.body).encode()
        self.send_response(canned.status)
        headers = {"Content-Type": "application/json", **canned.headers}
        for name, value in headers.items():
            self.send_header(name, value)
        if canned.length:
            self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

    def date_time_string(self, timestamp: float | None = None) -> str:
        date = self.server.api.date
        if date is not None and timestamp is None:
            return format_datetime(date.astimezone(UTC), usegmt=True)
        return super().date_time_string(timestamp)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output clean


class _Server(ThreadingHTTPServer):
    api: FakeAPI

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that timed out has hung up; writing to it fails, and that
        # is expected, not a test failure.
        pass


@contextmanager
def _serve() -> Iterator[FakeAPI]:
    server = _Server(("127.0.0.1", 0), _Handler)
    host, port = server.server_address[:2]
    server.api = FakeAPI(f"http://{host}:{port}")
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        yield server.api
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def fake_api(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAPI]:
    # A proxy configured in the environment must not intercept loopback.
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    with _serve() as api:
        yield api


@pytest.fixture
def other_host(fake_api: FakeAPI) -> Iterator[FakeAPI]:
    """Another server (another origin): where a redirect must not take a credential."""
    with _serve() as api:
        yield api


@pytest.fixture
def now() -> datetime:
    return NOW


@pytest.fixture
def token() -> str:
    return TOKEN


@pytest.fixture
def make_client(fake_api: FakeAPI) -> Callable[..., Any]:
    """Build a client pointed at the fake API, with the fixed clock and TOKEN."""

    def make(cls: type[Any], **kwargs: Any) -> Any:
        kwargs.setdefault("base_url", fake_api.url)
        kwargs.setdefault("now", lambda: NOW)
        kwargs.setdefault("timeout", (2.0, 5.0))
        return cls(TOKEN, **kwargs)

    return make
