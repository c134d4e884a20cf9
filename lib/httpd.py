"""The worker's HTTP endpoints, served by gevent.pywsgi on the worker's own
loop: /metrics (Prometheus), /healthz, /readyz, and the admin page under
/admin/ (lib/admin) when it is on.

The server is one supervised part of the worker: a server that cannot bind
(the port is taken) dies, is reported, and is started again with backoff.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterable
from typing import Any

import gevent
from gevent.event import Event
from gevent.pywsgi import LoggingLogAdapter, WSGIServer
from prometheus_client import CollectorRegistry, make_wsgi_app

from lib import metrics, stats
from lib.db import PoolTimeout, is_conn_failure, is_server_error
from lib.errors import capture
from lib.logs import one_line
from lib.migrate import migrations
from lib.settings import mask_secret
from lib.sql import Q
from lib.web import App, Environ, Request, StartResponse, text

log = logging.getLogger("jobs.http")

# /readyz answers within this, whatever the database does: a health check
# that hangs is read as down anyway, only later.
READY_TIMEOUT = 3.0
# In-flight requests get this long when the server stops.
STOP_TIMEOUT = 2.0


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


class HttpServer:
    """serve(stop) is the supervised part. It runs until the worker kills its
    helpers at the very end of shutdown, not when stop is set: during the
    shutdown window /healthz and /readyz say "stopping" and /metrics shows
    the jobs draining."""

    def __init__(self, addr: tuple[str, int], app: App) -> None:
        self.addr = addr
        self.app = app
        self.port: int | None = None  # the bound port once serving (addr may ask for 0)
        self.serving = Event()

    def serve(self, stop: Event) -> None:
        """Raises when the address cannot be bound: the supervisor tries again."""
        # Bound here, not by gevent: its own listener leaks the socket when
        # the bind fails, once per restart while the port is taken.
        family = socket.AF_INET6 if ":" in self.addr[0] else socket.AF_INET
        listener = socket.create_server(self.addr, family=family)
        server = WSGIServer(
            listener,
            self.app,
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
        self.port = server.server_port
        self.serving.set()
        log.info("serving http on %s:%d", server.server_host, server.server_port)
        try:
            Event().wait()  # until killed
        finally:
            self.serving.clear()
            server.stop(timeout=STOP_TIMEOUT)


def for_worker(
    db: Any,
    addr: tuple[str, int],
    *,
    admin_token: str | None,
    queues: Iterable[str],
    listener: Any,
    supervisor: Any,
    stop: Event,
    outage: Any,
) -> HttpServer:
    """The server over a running worker's own objects: its pool, listener,
    supervisor and queues (shown even while they have no rows)."""
    queues = sorted(set(queues))
    registry = metrics.registry(
        db,
        stats=stats.queue_stats,
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
        from lib.admin import Admin

        admin = Admin(db, admin_token, queue_stats=stats.queue_stats, workers=stats.workers, queues=queues)
    return HttpServer(addr, make_app(Health(db, listener=listener, stop=stop), registry, admin=admin))
