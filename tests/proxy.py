"""A TCP proxy on loopback in front of Postgres that a test can cut off.

While down it closes every open connection and refuses new ones, as a database
restart or a network fault would, without touching the server the rest of the
suite uses. Armed with drop_next_reply(), it forwards a statement (and so its
commit) but drops the server's reply and closes the client's side only: the
client cannot know what committed, and the server process lingers.
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
        self._drop_next = False
        self.dropped = 0
        # Server sides left open after a dropped reply, closed by close().
        self._held: list[socket.socket] = []

    def _handle(self, client: socket.socket, _address: object) -> None:
        if not self.is_up:
            client.close()
            return
        upstream = socket.socket(self.family, socket.SOCK_STREAM)
        upstream.connect(self.address)
        self._pipes.update((client, upstream))
        pumps = [gevent.spawn(self._pump, client, upstream), gevent.spawn(self._replies, upstream, client)]
        gevent.joinall(pumps, count=1)
        gevent.killall(pumps)
        for sock in (client, upstream):
            self._pipes.discard(sock)
            if sock in self._held:
                continue
            sock.close()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass

    def _replies(self, upstream: socket.socket, client: socket.socket) -> None:
        """Server to client, unless a reply is to be dropped."""
        try:
            while data := upstream.recv(65536):
                if self._drop_next:
                    self._drop_next = False
                    self.dropped += 1
                    self._held.append(upstream)
                    client.shutdown(socket.SHUT_RDWR)
                    return
                client.sendall(data)
        except OSError:
            pass

    def drop_next_reply(self) -> None:
        """The next reply the server sends, on any connection, never arrives:
        the statement it answers has run (and committed) on the server."""
        self._drop_next = True

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
        for sock in self._held:
            sock.close()
