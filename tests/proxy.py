"""A TCP proxy on loopback in front of Postgres that a test can cut off.

While down it closes every open connection and refuses new ones, as a database
restart or a network fault would, without touching the server the rest of the
suite uses.
"""

from __future__ import annotations

import contextlib
import socket
from urllib.parse import parse_qs, urlsplit, urlunsplit

import gevent
from gevent.server import StreamServer


def _target(url: str) -> tuple[int, str | tuple[str, int]]:
    parts = urlsplit(url)
    host = parse_qs(parts.query).get("host", [parts.hostname or "localhost"])[0]
    port = parts.port or 5432
    if host.startswith("/"):
        return socket.AF_UNIX, f"{host}/.s.PGSQL.{port}"
    return socket.AF_INET, (host, port)


class Proxy:
    def __init__(self, url: str) -> None:
        self.family, self.address = _target(url)
        parts = urlsplit(url)
        self.server = StreamServer(("127.0.0.1", 0), self._handle)
        self.server.start()
        port = self.server.server_port
        netloc = f"{parts.username or 'postgres'}@127.0.0.1:{port}"
        self.url = urlunsplit(("postgresql", netloc, parts.path, "", ""))
        self.is_up = True
        self._pipes: set[socket.socket] = set()

    def _handle(self, client: socket.socket, _address: object) -> None:
        if not self.is_up:
            client.close()
            return
        upstream = socket.socket(self.family, socket.SOCK_STREAM)
        upstream.connect(self.address)
        self._pipes.update((client, upstream))
        pumps = [gevent.spawn(self._pump, client, upstream), gevent.spawn(self._pump, upstream, client)]
        gevent.joinall(pumps, count=1)
        for sock in (client, upstream):
            self._pipes.discard(sock)
            sock.close()
        gevent.killall(pumps)

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass

    def down(self) -> None:
        self.is_up = False
        for sock in list(self._pipes):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def up(self) -> None:
        self.is_up = True

    def close(self) -> None:
        self.down()
        self.server.stop()
