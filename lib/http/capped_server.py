"""The gevent.pywsgi server the endpoints run on, bounded so that no client
can take the descriptors the worker's own parts need: a deadline on each
request head, a cap on open connections (at the cap a new connection takes
the place of the one that has waited longest for a head), and failing
accepts paused and reported once per run of failures."""

from __future__ import annotations

from typing import Any

import gevent
from gevent.pywsgi import WSGIHandler, WSGIServer

from lib.setup.error_reports import Outage

# A client has this long to send a whole request head, counted from its
# connect or, on a kept-alive connection, from the end of the previous
# response: a client that sends slowly or not at all holds a descriptor only
# that long. Every client of these pages sends its head at once.
HEAD_TIMEOUT = 5.0
# After the head, each read of a body and each write of a response: a client
# that stops reading or sending is cut off. Longer than HEAD_TIMEOUT, so a
# head's own deadline is what ends a slow head.
IO_TIMEOUT = 10.0
# Open HTTP connections at most. A scraper, a health check and an operator's
# browser use a handful at a time; 200 leaves most of even systemd's default
# 1,024 descriptors to the worker's own use, which grows with its queues
# (a pool connection each, their jobs' API sockets). A burst of accepts may
# pass it by up to WSGIServer.max_accept until the evicted ones have closed.
MAX_CONNECTIONS = 200
# A run of failed accepts (EMFILE: the process is out of descriptors) ends
# once accepts have gone this long without a failure: a shortage that lets
# some accepts through is still one shortage, and one line.
ACCEPT_QUIET = 10.0


class HeadTimedHandler(WSGIHandler):
    """pywsgi's handler, with a deadline on each request head."""

    server: CappedServer

    def __init__(self, sock: Any, address: Any, server: CappedServer) -> None:
        super().__init__(sock, address, server)
        self._head = gevent.Timeout(server.head_timeout)
        self._greenlet = gevent.getcurrent()

    def handle(self) -> None:
        try:
            super().handle()  # closes the socket, however it ends
        except gevent.Timeout as exc:
            if exc is not self._head:
                raise
        finally:
            self._head_done()
            self._head.close()

    def handle_one_request(self) -> Any:
        # The head's deadline alone bounds the wait for it: a socket timeout
        # restarts with each byte, and a client sending one byte at a time
        # would never meet it.
        self.socket.settimeout(None)
        self._head.start()
        self.server.waiting[self] = None
        try:
            return super().handle_one_request()
        finally:
            self._head_done()

    def read_request(self, raw_requestline: str) -> Any:
        try:
            return super().read_request(raw_requestline)
        finally:
            self._head_done()

    def _head_done(self) -> None:
        self._head.cancel()
        self.server.waiting.pop(self, None)
        sock = self.__dict__.get("socket")  # gone once the connection has ended
        if sock is not None:
            sock.settimeout(IO_TIMEOUT)

    def cut(self) -> None:
        """Ends the connection now, as its head's deadline would, if it still
        waits for a head (it may have read one since it was picked)."""
        if self._head.pending:
            self._greenlet.throw(self._head)


class CappedServer(WSGIServer):
    """pywsgi's server, with the connections counted and capped, and a
    failing accept paused and reported once per run of failures."""

    handler_class = HeadTimedHandler

    def __init__(self, *args: Any, head_timeout: float, max_connections: int, **kwargs: Any) -> None:
        self.head_timeout = head_timeout
        self.max_connections = max_connections
        self.open = 0  # accepted, not yet closed
        # The connections waiting for a request head, the longest-waiting first.
        self.waiting: dict[HeadTimedHandler, None] = {}
        self._accepts = Outage("http accept")
        self._last_failure = -ACCEPT_QUIET
        self._accept_delay = self.min_delay
        super().__init__(*args, **kwargs)

    def do_read(self) -> Any:
        try:
            accepted = super().do_read()
        except OSError as exc:
            if self.is_fatal_error(exc):
                raise
            self._accept_failed(exc)
            return None
        if accepted is None:
            return None
        self._accept_delay = self.min_delay
        if self.loop.now() - self._last_failure >= ACCEPT_QUIET:
            self._accepts.recovered()
        # Not a Pool(max_connections) as spawn=: a full pool stops the
        # accepts, and a health check then waits behind every client that
        # holds a connection without sending.
        if self.open >= self.max_connections and not self._evict():
            accepted[0].close()  # every connection is busy with a request
            return None
        self.open += 1
        return accepted

    def do_close(self, sock: Any, *args: Any) -> None:
        self.open -= 1
        super().do_close(sock, *args)

    def _evict(self) -> bool:
        """Ends the connection that has waited longest for a request head, if any."""
        if not self.waiting:
            return False
        handler = next(iter(self.waiting))
        del self.waiting[handler]
        self.loop.run_callback(handler.cut)
        return True

    def _accept_failed(self, exc: OSError) -> None:
        """One line per run of failures; accepts pause, with backoff, for
        the descriptor (or memory) to come back: the listener stays readable,
        and trying again at once would spin."""
        self._last_failure = self.loop.now()
        self._accepts.failed(exc)
        self._evict()  # a descriptor back from a client that sends nothing
        self.stop_accepting()
        # BaseServer's own timer for its accept backoff, which stop_accepting cancels.
        self._timer = self.loop.timer(self._accept_delay)
        self._timer.start(self._start_accepting_if_started)
        self._accept_delay = min(self.max_delay, self._accept_delay * 2)
