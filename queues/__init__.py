"""The registry: one constructor per queue. A new queue is one line here."""

from collections.abc import Callable

from lib.db import DB
from lib.poller import Poller
from queues import caches, maintenance

REGISTRY: list[Callable[[DB], Poller]] = [
    caches.make_worker,
    maintenance.make_worker,
]
