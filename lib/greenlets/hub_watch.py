"""Say when something holds the hub: a handler in a CPU loop or an unpatched
blocking call stops every other greenlet of the worker (other queues, wakeups,
the clock). gevent's monitor thread notices; this turns its notice into a log
line naming the greenlet and where it stands, and one report per greenlet.

The leases of running jobs are renewed from a thread of their own meanwhile
(lib/background/leases.py), so a blocked hub is slow, not a double run.

Only the hub given to watch() is watched. gevent.config.monitor_thread stays
off: it would give every hub its own monitor, and a native thread that ever
waits on a gevent lock gets a hub whose loop never runs, which such a monitor
reports as held for as long as the thread lives. A monitor's own report
(a log line, an event) would then give its thread a hub, and a monitor, too.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

import gevent
import gevent.events
from gevent._monitor import PeriodicMonitoringThread

from lib.setup.error_reports import capture_message

log = logging.getLogger("jobs.blocked")

_reported: weakref.WeakSet[Any] = weakref.WeakSet()

# The hubs watch() was given: a monitor started for any other (by code that
# turns gevent.config.monitor_thread on) is not heard.
_watched: weakref.WeakSet[Any] = weakref.WeakSet()


def watch(after: float) -> None:
    """Report any greenlet that holds this thread's hub (the worker's) for
    longer than `after` seconds."""
    gevent.config.max_blocking_time = after
    # Its stack dump goes to the log instead, one line per notice.
    gevent.config.print_blocking_reports = False
    if _on_blocked not in gevent.events.subscribers:
        gevent.events.subscribers.append(_on_blocked)
    hub = gevent.get_hub()
    _watched.add(hub)
    if hub.periodic_monitoring_thread is None:
        # What hub.start_periodic_monitoring_thread() does, less its memory
        # monitor: only the blocking check is wanted, and that monitor imports
        # psutil (and keeps it loaded) to enforce
        # gevent.config.max_memory_usage, which this worker never sets.
        hub.periodic_monitoring_thread = PeriodicMonitoringThread(hub)
        gevent.events.notify_and_call_entry_points(
            gevent.events.PeriodicMonitorThreadStartedEvent(hub.periodic_monitoring_thread)
        )


def _on_blocked(event: object) -> None:
    # Called in the monitor thread, while the hub is still held.
    if not isinstance(event, gevent.events.EventLoopBlocked) or event.hub not in _watched:
        return
    greenlet = event.greenlet
    where = _where(event.info)
    log.warning("the hub has been held for over %gs by %s%s", event.blocking_time, _name(greenlet), where)
    if greenlet is not None and greenlet not in _reported:
        _reported.add(greenlet)
        capture_message(f"hub blocked by {_name(greenlet)}{where}", level="warning")


def _name(greenlet: Any) -> str:
    return str(getattr(greenlet, "name", None) or greenlet)


def _where(info: list[str]) -> str:
    """The innermost frame of the blocked stack: the line that holds the hub."""
    lines = "\n".join(info).splitlines()
    start = next((n for n, line in enumerate(lines) if line.startswith("Blocked Stack")), None)
    if start is None:
        return ""
    frame = ""
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        if line.strip().startswith("File "):
            frame = line.strip()
    return f" at {frame}" if frame else ""
