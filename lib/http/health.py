"""What /healthz and /readyz say once the worker has its database:
migrations applied, listener connected (before, lib/http/httpd.py's Starting)."""

from __future__ import annotations

from typing import Any

import gevent
from gevent.event import Event

from lib.setup.dsn import mask_secret
from lib.setup.logs import one_line
from lib.store.driver_errors import is_server_error
from lib.store.migrate import migrations
from lib.store.sql import Q

# /readyz answers within this, whatever the database does: a health check
# that hangs is read as down anyway, only later.
READY_TIMEOUT = 3.0


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
