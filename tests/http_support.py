"""Serving the worker's HTTP app on loopback for a test (not fixtures)."""

import socket
from collections.abc import Iterator
from contextlib import contextmanager

import gevent
from gevent.event import Event

from lib.http.httpd import HttpServer


@contextmanager
def serving(app) -> Iterator[str]:
    """The app on a free loopback port, as the worker serves it; its base URL."""
    server = HttpServer(("127.0.0.1", 0), app)
    part = gevent.spawn(server.serve, Event())
    try:
        assert server.serving.wait(10), "the server did not start"
        yield f"http://127.0.0.1:{server.port}"
    finally:
        part.kill()


def free_port() -> int:
    """A port nothing listens on now (another process may take it later: rare)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
