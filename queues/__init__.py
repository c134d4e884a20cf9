"""The registry: one constructor per queue. A new queue is one line in
REGISTRY; one that needs a setting gets it bound in registry()."""

from collections.abc import Callable
from functools import update_wrapper
from typing import Any

from lib.run.queue import Queue
from lib.setup.settings import Settings
from lib.store.db import DB
from queues import anthropic, apollo, caches, github, maintenance, slack

REGISTRY: list[Callable[[DB], Queue]] = [
    caches.make_worker,
    maintenance.make_worker,
    github.make_worker,
    slack.make_worker,
    anthropic.make_worker,
    apollo.make_worker,
]


def registry(settings: Settings) -> list[Callable[[DB], Queue]]:
    """REGISTRY, in its order, with each queue's settings bound in: what
    worker.main runs. Entries stay functions of the pool alone, so a test (or
    the registry check) builds them as it builds REGISTRY's. REGISTRY's own
    entries run on the defaults: every API queue off, as without a token."""
    bound = {
        maintenance.make_worker: _bind(maintenance.make_worker, retention_days=settings.retention_days),
        # Without its token an API queue is off, and the worker says so at start.
        github.make_worker: _bind(github.make_worker, token=settings.github_token, base_url=settings.github_base_url),
        slack.make_worker: _bind(slack.make_worker, token=settings.slack_bot_token, base_url=settings.slack_base_url),
        anthropic.make_worker: _bind(
            anthropic.make_worker, token=settings.anthropic_api_key, base_url=settings.anthropic_base_url
        ),
        apollo.make_worker: _bind(apollo.make_worker, token=settings.apollo_api_key, base_url=settings.apollo_base_url),
    }
    return [bound.get(make, make) for make in REGISTRY]


def _bind(make: Callable[..., Queue], **values: Any) -> Callable[[DB], Queue]:
    """make with values bound, named as make (the registry check's label).
    Not a functools.partial: its repr shows the values, a token among them."""

    def bound(db: DB) -> Queue:
        return make(db, **values)

    return update_wrapper(bound, make)
