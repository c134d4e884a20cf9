"""A TCP proxy on loopback in front of Postgres that a test can cut off.

While down it closes every open connection and refuses new ones, as a database
restart or a network fault would, without touching the server the rest of the
suite uses. Armed with drop_next_reply(), it forwards a statement (and so its
commit) but drops the server's reply and closes the client's side only: the
client cannot know what committed, and the server process lingers.

stall() makes it a link that hangs without breaking (a half-dead NAT, a stuck
load balancer): it goes on reading both sides of every open and new
connection, so TCP acknowledges everything and keepalives are answered, but
it holds the bytes instead of forwarding them and closes nothing. resume()
forwards what it held, in order, and lets bytes flow again.
"""

from __future__ import annotations

import contextlib
import socket
from urllib.parse import parse_qs, urlsplit, urlunsplit

import gevent
from gevent.event import Event
from gevent.queue import Queue
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
        # Set while bytes flow; clear while stalled.
        self._flowing = Event()
        self._flowing.set()

    def _handle(self, client: socket.socket, _address: object) -> None:
        if not self.is_up:
            client.close()
            return
        upstream = socket.socket(self.family, socket.SOCK_STREAM)
        try:
            upstream.connect(self.address)
        except OSError:
            # The server is down (restarting): the client is refused as it
            # would be without the proxy.
            upstream.close()
            client.close()
            return
        self._pipes.update((client, upstream))
        # Each direction: a reader that never stops reading, and a writer
        # that forwards what it read only while bytes flow.
        to_server: Queue = Queue()
        to_client: Queue = Queue()
        readers = [
            gevent.spawn(self._pump, client, to_server),
            gevent.spawn(self._replies, upstream, client, to_client),
        ]
        writers = [gevent.spawn(self._forward, to_server, upstream), gevent.spawn(self._forward, to_client, client)]
        gevent.joinall(writers, count=1)
        gevent.killall(readers + writers)
        for sock in (client, upstream):
            self._pipes.discard(sock)
            if sock in self._held:
                continue
            sock.close()

    @staticmethod
    def _pump(src: socket.socket, out: Queue) -> None:
        try:
            while data := src.recv(65536):
                out.put(data)
        except OSError:
            pass
        out.put(None)

    def _forward(self, chunks: Queue, dst: socket.socket) -> None:
        """Send what a reader read, in order, each chunk once bytes flow."""
        try:
            while (data := chunks.get()) is not None:
                self._flowing.wait()
                dst.sendall(data)
        except OSError:
            pass

    def _replies(self, upstream: socket.socket, client: socket.socket, out: Queue) -> None:
        """Server to client, unless a reply is to be dropped."""
        try:
            while data := upstream.recv(65536):
                if self._drop_next:
                    self._drop_next = False
                    self.dropped += 1
                    self._held.append(upstream)
                    client.shutdown(socket.SHUT_RDWR)
                    break
                out.put(data)
        except OSError:
            pass
        out.put(None)

    def drop_next_reply(self) -> None:
        """The next reply the server sends, on any connection, never arrives:
        the statement it answers has run (and committed) on the server."""
        self._drop_next = True

    def stall(self) -> None:
        """Hold every byte, both ways, on every connection, open or new."""
        self._flowing.clear()

    def resume(self) -> None:
        """Forward what was held, in order, and let bytes flow again."""
        self._flowing.set()

    def down(self) -> None:
        """Close every connection and refuse new ones (a stall ends first)."""
        self.resume()
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
