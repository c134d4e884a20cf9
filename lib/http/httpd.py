"""The worker's HTTP endpoints, served by gevent.pywsgi on the worker's own
loop: /metrics (Prometheus), /healthz, /readyz, and the admin page under
/admin/ (lib/http/admin) when it is on.

The server is one supervised part of the worker. One that cannot bind (the
port is taken: another worker on the host) says so once and tries again
quietly; the worker runs on without its endpoints meanwhile. It may start
before the worker has its database, serving starting_app until the worker's
own app takes its place.

No client can take the descriptors the worker's own parts need (its pool,
listener and lease connections, its jobs' sockets): a request head has a
deadline, the open connections have a cap, and at the cap a new connection
takes the place of the one that has waited longest for a head.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterable
from typing import Any

import gevent
from gevent.event import Event
from gevent.pywsgi import LoggingLogAdapter, WSGIHandler, WSGIServer
from prometheus_client import CollectorRegistry, make_wsgi_app

from lib.http import metrics
from lib.http.web import App, Environ, Request, StartResponse, text
from lib.operate import overview
from lib.setup.dsn import mask_secret
from lib.setup.errors import Outage, capture
from lib.setup.logs import one_line
from lib.store.db import PoolTimeout, is_conn_failure, is_server_error
from lib.store.migrate import migrations
from lib.store.sql import Q

log = logging.getLogger("jobs.http")

# /readyz answers within this, whatever the database does: a health check
# that hangs is read as down anyway, only later.
READY_TIMEOUT = 3.0
# In-flight requests get this long when the server stops.
STOP_TIMEOUT = 2.0
# A client has this long to send a whole request head, counted from its
# connect or, on a kept-alive connection, from the end of the previous
# response: a client that sends slowly or not at all holds a descriptor no
# longer. Every client of these pages sends its head at once.
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
# While the address is taken, a bind is tried again this often: the process
# holding the port (an old worker lingering, another worker on the host) may
# go, and an operator who frees the port gets the endpoints without a restart.
BIND_RETRY = 30.0


class Health:
    """What /healthz and /readyz ask of the worker."""

    def __init__(self, db: Any, *, listener: Any = None, stop: Event | None = None) -> None:
        self.db = db
        self.listener = listener
        self.stop = stop
        # The migrations this code knows; a database that lacks one is not ready.
        self.expected = [(version, name) for version, name, _ in migrations()]

    def alive(self) -> tuple[bool, str]:
        # Answering at all is the proof: a hub held by a handler answers nothing.
        if self.stop is not None and self.stop.is_set():
            return False, "stopping: running jobs get the shutdown window"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        if self.stop is not None and self.stop.is_set():
            return False, "stopping: running jobs get the shutdown window"
        try:
            with gevent.Timeout(READY_TIMEOUT):
                applied = {version for (version,) in self.db.query(Q.migration_applied)}
        except (Exception, gevent.Timeout) as exc:
            if is_server_error(exc):
                # It answered, but cannot say (no schema_migrations table: never migrated).
                return False, f"database refused the check: {self._reason(exc)}"
            return False, f"database unreachable: {self._reason(exc)}"
        missing = [name for version, name in self.expected if version not in applied]
        if missing:
            return False, f"migrations not applied: {', '.join(missing)}"
        if self.listener is not None and not self.listener.listening.is_set():
            return False, "listener not connected: wakeups wait for the fallback poll"
        return True, "ready"

    def _reason(self, exc: BaseException) -> str:
        if isinstance(exc, gevent.Timeout):
            return f"no answer within {READY_TIMEOUT:g}s"
        first = (str(exc).strip().splitlines() or [""])[0]
        # libpq's messages name the host, not the password; masked all the same.
        return one_line(mask_secret(f"{type(exc).__name__}: {first}"[:300], self.db.dsn))


class Starting:
    """What /healthz and /readyz say before the worker has its database:
    `state`, set by the worker as its start goes on."""

    def __init__(self, state: str = "starting: connecting to the database") -> None:
        self.state = state


def starting_app(starting: Starting) -> App:
    """The app served before the worker has its database. /healthz answers
    200 (the process is alive and doing what it should: waiting), with the
    state; every other page is 503 with the state, as nothing can be read yet."""

    def app(environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        if Request(environ).path == "/healthz":
            return text(200, starting.state)(environ, start_response)
        return text(503, starting.state)(environ, start_response)

    return app


def make_app(health: Health, registry: CollectorRegistry, *, admin: App | None = None) -> App:
    """The WSGI app: the fixed endpoints, and /admin/ when admin is given (else 404)."""
    metrics = make_wsgi_app(registry)

    def app(environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        request = Request(environ)
        path = request.path
        try:
            if path == "/admin" or path.startswith("/admin/"):
                if admin is None:
                    return text(404, "not found: the admin page is off (JOBS_ADMIN_TOKEN is unset)")(
                        environ, start_response
                    )
                return admin(environ, start_response)
            if request.method not in ("GET", "HEAD"):
                return text(405, "method not allowed")(environ, start_response)
            if path == "/metrics":
                return metrics(environ, start_response)
            if path == "/healthz":
                ok, reason = health.alive()
            elif path == "/readyz":
                ok, reason = health.ready()
            else:
                return text(404, "not found")(environ, start_response)
            return text(200 if ok else 503, reason)(environ, start_response)
        except Exception as exc:
            if is_conn_failure(exc) or isinstance(exc, PoolTimeout):
                # The database's outage, which the pollers report once; a page
                # asked meanwhile says so instead of adding an event per request.
                log.warning("%s %s: database unreachable: %s", request.method, path, exc)
                return text(503, "database unreachable; try again shortly")(environ, start_response)
            # A bug in one page: reported, and the server goes on.
            log.error("%s %s failed: %s: %s", request.method, path, type(exc).__name__, exc, exc_info=exc)
            capture(exc, message="http request", path=path)
            return text(500, "internal error")(environ, start_response)

    return app


class _Handler(WSGIHandler):
    """pywsgi's handler, with a deadline on each request head."""

    server: _Server

    def __init__(self, sock: Any, address: Any, server: _Server) -> None:
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


class _Server(WSGIServer):
    """pywsgi's server, with the connections counted and capped, and a
    failing accept paused and reported once per run of failures."""

    handler_class = _Handler

    def __init__(self, *args: Any, head_timeout: float, max_connections: int, **kwargs: Any) -> None:
        self.head_timeout = head_timeout
        self.max_connections = max_connections
        self.open = 0  # accepted, not yet closed
        # The connections waiting for a request head, the longest-waiting first.
        self.waiting: dict[_Handler, None] = {}
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


class HttpServer:
    """serve(stop) is the supervised part. It runs until the worker kills its
    helpers at the very end of shutdown, not when stop is set: during the
    shutdown window /healthz and /readyz say "stopping" and /metrics shows
    the jobs draining."""

    def __init__(
        self,
        addr: tuple[str, int],
        app: App,
        *,
        head_timeout: float = HEAD_TIMEOUT,
        max_connections: int = MAX_CONNECTIONS,
        bind_retry: float | None = None,
    ) -> None:
        self.addr = addr
        # Read at each request: the worker swaps starting_app for its own once it has its database.
        self.app = app
        self.bind_retry = BIND_RETRY if bind_retry is None else bind_retry
        self.head_timeout = head_timeout
        self.max_connections = max_connections
        self.port: int | None = None  # the bound port once serving (addr may ask for 0)
        self.serving = Event()
        self._server: _Server | None = None

    @property
    def open_connections(self) -> int:
        return self._server.open if self._server is not None else 0

    @property
    def waiting_for_head(self) -> int:
        """The open connections that have not yet sent a whole request head."""
        return len(self._server.waiting) if self._server is not None else 0

    def serve(self, stop: Event) -> None:
        """Binds (waiting while the address is taken) and serves until killed;
        returns when stop is set before the address could be bound."""
        listener = self._bind(stop)
        if listener is None:
            return
        server = _Server(
            listener,
            self._dispatch,
            head_timeout=self.head_timeout,
            max_connections=self.max_connections,
            # Else gevent asks the resolver for the address's name (a reverse
            # lookup) at start, and that starts its thread pool (a thread,
            # and about 0.1 MB resident) in a worker that may resolve nothing
            # else. No page reads SERVER_NAME.
            environ={"SERVER_NAME": self.addr[0]},
            # One line per request at DEBUG: a scrape every few seconds is not news.
            log=LoggingLogAdapter(log, logging.DEBUG),
            error_log=LoggingLogAdapter(log, logging.ERROR),
        )
        server.start()
        self._server = server
        self.port = server.server_port
        self.serving.set()
        log.info("serving http on %s:%d", server.server_host, server.server_port)
        try:
            Event().wait()  # until killed
        finally:
            self.serving.clear()
            server.stop(timeout=STOP_TIMEOUT)

    def _dispatch(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        return self.app(environ, start_response)

    def _bind(self, stop: Event) -> socket.socket | None:
        """The listening socket; while the address cannot be bound, one
        warning and a quiet try every bind_retry seconds (no traceback: a
        taken port is the operator's to change, not a bug); None once stop is set.
        Bound here, not by gevent: its own listener leaks the socket when the
        bind fails, once per try while the port is taken."""
        family = socket.AF_INET6 if ":" in self.addr[0] else socket.AF_INET
        warned = False
        while True:
            try:
                return socket.create_server(self.addr, family=family)
            except OSError as exc:
                if not warned:
                    log.warning(
                        "cannot listen on %s: %s; the worker runs without /healthz, /readyz, /metrics and the"
                        " admin page, and tries again every %gs (each worker on a host needs its own"
                        " JOBS_HTTP_ADDR, or JOBS_HTTP_ADDR=off)",
                        _shown(self.addr),
                        # Not str(exc): create_server's adds the address a second time.
                        os.strerror(exc.errno) if exc.errno and exc.errno > 0 else exc,
                        self.bind_retry,
                    )
                    warned = True
            if stop.wait(self.bind_retry):
                return None


def _shown(addr: tuple[str, int]) -> str:
    """host:port as JOBS_HTTP_ADDR writes it ([v6]:port)."""
    host, port = addr
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def worker_app(
    db: Any,
    *,
    admin_token: str | None,
    queues: Iterable[str],
    listener: Any,
    supervisor: Any,
    stop: Event,
    outage: Any,
) -> App:
    """The app over a running worker's own objects: its pool, listener,
    supervisor and queues (shown even while they have no rows)."""
    queues = sorted(set(queues))
    registry = metrics.registry(
        db,
        stats=overview.queue_stats,
        queues=queues,
        listener=listener,
        supervisor=supervisor,
        outage=outage,
        conn_failure=is_conn_failure,
    )
    admin = None
    if admin_token:
        # Only here: the admin page's templates (Jinja2) are memory that a
        # worker without JOBS_ADMIN_TOKEN never uses.
        from lib.http.admin import Admin

        admin = Admin(db, admin_token, queue_stats=overview.queue_stats, workers=overview.workers, queues=queues)
    return make_app(Health(db, listener=listener, stop=stop), registry, admin=admin)
