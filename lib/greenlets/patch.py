"""gevent's patching of the standard library, as each worker process does it
before anything else is imported."""

import gevent.events
from gevent import monkey


def patch_stdlib() -> None:
    """monkey.patch_all(), with gevent's plugins of it left unlooked-for.
    gevent finds those through importlib.metadata's entry points, and that
    search keeps modules an idle worker has no other use for (about 1.6 MB
    resident). gevent's one plugin of its own warns when signal is patched
    without os, which patch_all never does; subscribers registered in the
    process (gevent.events.subscribers) are still told of every step."""
    gevent.events.notify_and_call_entry_points = gevent.events.notify
    monkey.patch_all()
