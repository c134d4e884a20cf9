"""The registry: one constructor per queue. A new queue is one line here."""

from collections.abc import Callable

from lib.db import DB
from lib.poller import Poller
from queues import anthropic, apollo, caches, github, maintenance, slack

REGISTRY: list[Callable[[DB], Poller]] = [
    caches.make_worker,
    maintenance.make_worker,
    github.make_worker,
    slack.make_worker,
    anthropic.make_worker,
    apollo.make_worker,
]
