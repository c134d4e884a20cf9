"""A queue's definition: what a registry entry returns, plain data built
without a runtime. The worker builds one Poller (lib/run/poller.py) of each,
on its own runtime; the registry check reads the definitions alone."""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from lib.insert import check_name
from lib.job import Handler, Throttle
from lib.job.rate import Budget, Rate, limits_key
from lib.store.retry_backoff import BASE_SECONDS as RETRY_BASE_SECONDS

# The reason of the pause the worker takes by itself after an API rejected a
# token begins so; a worker that starts (after the token was fixed) ends them.
AUTH_PREFIX = "auth: "


@dataclass(frozen=True, eq=False)
class Queue:
    name: str
    # Job name -> its handler.
    dispatch: Mapping[str, Handler]
    throttle: Throttle | None = None
    job_timeout: float = 600.0
    # Only a fallback: LISTEN/NOTIFY wakes a poller, and an idle one sleeps
    # to its queue's next delayed row or to the end of a pause or throttle.
    poll_interval: float = 120.0
    concurrency: int = 1
    max_attempts: int = 1
    # Why this queue must not run in this process (say, its API token is
    # not configured); the worker says so once and leaves it alone.
    disabled_reason: str | None = None
    # Job names that refuse a second pending or started copy with the same args.
    dedupe: AbstractSet[str] = field(default=frozenset())
    retry_base: float = RETRY_BASE_SECONDS
    # Jobs started per period across every process (lib/run/rate.py); the
    # throttle and the concurrency apply as well.
    rate: Rate | None = None
    # Units its jobs spend (an API's tokens), each within a budget across
    # every process (lib/job/rate.py's Budget); the rate applies as well.
    budgets: tuple[Budget, ...] = ()

    def __post_init__(self) -> None:
        # Copies: a caller's dict or set changed later changes no definition.
        object.__setattr__(self, "dispatch", dict(self.dispatch))
        object.__setattr__(self, "dedupe", frozenset(self.dedupe))
        object.__setattr__(self, "budgets", tuple(self.budgets))
        _check(self)

    @property
    def handles(self) -> frozenset[str]:
        return frozenset(self.dispatch)


def _check(q: Queue) -> None:
    # A bad definition fails where it is built: the worker refuses to start,
    # and `check` says so, before the first job.
    check_name("queue", q.name)
    if not q.dispatch or not all(callable(h) for h in q.dispatch.values()):
        raise ValueError(f"queue {q.name}: dispatch must map job names to handlers")
    for name in q.dispatch:
        check_name(f"queue {q.name}: job name", name)
    if q.job_timeout <= 0 or q.poll_interval <= 0:
        raise ValueError(f"queue {q.name}: job_timeout and poll_interval must be positive")
    if q.retry_base <= 0:
        raise ValueError(f"queue {q.name}: retry_base must be positive")
    if q.concurrency < 1 or q.max_attempts < 1:
        raise ValueError(f"queue {q.name}: concurrency and max_attempts must be at least 1")
    if q.throttle is not None and not callable(q.throttle):
        raise ValueError(f"queue {q.name}: throttle must be callable")
    if q.rate is not None and not isinstance(q.rate, Rate):
        raise ValueError(f"queue {q.name}: rate must be a Rate, as Rate(100, per=60, burst=20)")
    if not all(isinstance(b, Budget) for b in q.budgets):
        raise ValueError(f"queue {q.name}: budgets are Budgets, as Budget('tokens_in', 30_000, per=60, most=4_000)")
    key = limits_key(q.name, q.rate, q.budgets)
    if q.rate is not None or q.budgets:
        check_name(f"queue {q.name}: rate key", key)
    if not q.dedupe <= q.dispatch.keys():
        raise ValueError(f"queue {q.name}: dedupe names jobs it does not handle: {set(q.dedupe) - set(q.dispatch)}")
