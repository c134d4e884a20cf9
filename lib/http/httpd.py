"""The worker's HTTP endpoints, served by gevent.pywsgi on the worker's own
loop: /metrics (Prometheus), /healthz, /readyz, and the admin page under
/admin/ (lib/http/admin) when it is on.

The server is one supervised part of the worker. One that cannot bind (the
port is taken: another worker on the host) says so once and tries again
quietly; the worker runs on without its endpoints meanwhile. It may start
before the worker has its database, serving Starting, which hands every
request to the worker's own app once there is one.

No client can take the descriptors the worker's own parts need (its pool,
listener and lease connections, its jobs' sockets): a request head has a
deadline, the open connections have a cap, and at the cap a new connection
takes the place of the one that has waited longest for a head.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gevent.event import Event
from gevent.pywsgi import LoggingLogAdapter
from prometheus_client import CollectorRegistry, make_wsgi_app

from lib.http import metrics
from lib.http.capped_server import HEAD_TIMEOUT, MAX_CONNECTIONS, CappedServer
from lib.http.health import Health
from lib.http.vitals import VitalsCollector
from lib.http.web import App, Environ, Request, StartResponse, text
from lib.operate import overview
from lib.setup.error_reports import capture
from lib.store.driver_errors import PoolTimeout, is_outage

log = logging.getLogger("jobs.http")

# In-flight requests get this long when the server stops.
STOP_TIMEOUT = 2.0
# While the address is taken, a bind is tried again this often: the process
# holding the port (an old worker lingering, another worker on the host) may
# go, and an operator who frees the port gets the endpoints without a restart.
BIND_RETRY = 30.0


class Starting:
    """The app the server starts with, before the worker has its database:
    /healthz answers 200 (the process is alive and doing what it should:
    waiting) with the state the worker says, every other page 503 with it,
    as nothing can be read yet. Once the worker hands over its own app
    (`started`), that app answers every request."""

    def __init__(self, state: str = "starting: connecting to the database") -> None:
        self.state = state
        self._worker_app: App | None = None

    def say(self, state: str) -> None:
        self.state = state

    def started(self, app: App) -> None:
        self._worker_app = app

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        if self._worker_app is not None:
            return self._worker_app(environ, start_response)
        status = 200 if Request(environ).path == "/healthz" else 503
        return text(status, self.state)(environ, start_response)


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
            if is_outage(exc) or isinstance(exc, PoolTimeout):
                # The database's outage (unreachable, read-only), which the
                # pollers report once; a page asked meanwhile says so instead
                # of adding an event per request.
                log.warning("%s %s: database unavailable: %s", request.method, path, exc)
                return text(503, "database unavailable; try again shortly")(environ, start_response)
            # A bug in one page: reported, and the server goes on.
            log.error("%s %s failed: %s: %s", request.method, path, type(exc).__name__, exc, exc_info=exc)
            capture(exc, message="http request", path=path)
            return text(500, "internal error")(environ, start_response)

    return app


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
        self.app = app
        self.bind_retry = BIND_RETRY if bind_retry is None else bind_retry
        self.head_timeout = head_timeout
        self.max_connections = max_connections
        self.port: int | None = None  # the bound port once serving (addr may ask for 0)
        self.serving = Event()
        self._server: CappedServer | None = None

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
        server = CappedServer(
            listener,
            self.app,
            head_timeout=self.head_timeout,
            max_connections=self.max_connections,
            # Else gevent asks the resolver for the address's name (a reverse
            # lookup) at start, and that starts its thread pool (a thread and
            # its memory) in a worker that may resolve nothing else. No page reads SERVER_NAME.
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
    concurrency: Mapping[str, int] | None = None,
    registered: Mapping[str, str | None] | None = None,
    schedule: Sequence[Any] = (),
    listener: Any,
    supervisor: Any,
    committer: Any,
    stop: Event,
    outage: Any,
) -> App:
    """The app over a running worker's own objects: its pool, listener,
    supervisor, group commit and queues (shown even while they have no rows);
    the admin page also gets every registered queue with why it is off (None:
    on), the concurrency of each queue it runs (the most a scale may set) and
    the clock's schedule."""
    queues = sorted(set(queues))
    registry = metrics.registry(
        db,
        stats=overview.queue_stats,
        queues=queues,
        listener=listener,
        supervisor=supervisor,
        committer=committer,
        outage=outage,
        conn_failure=is_outage,
    )
    registry.register(VitalsCollector(db, outage=outage, conn_failure=is_outage))
    admin = None
    if admin_token:
        # Only here: the admin page's templates (Jinja2) are memory that a
        # worker without JOBS_ADMIN_TOKEN never uses.
        from lib.http.admin import Admin

        admin = Admin(
            db,
            admin_token,
            queue_stats=overview.queue_stats,
            workers=overview.workers,
            queues=queues,
            concurrency=concurrency or {},
            registered=registered or {},
            schedule=schedule,
        )
    return make_app(Health(db, listener=listener, stop=stop), registry, admin=admin)
