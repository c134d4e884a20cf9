"""A queue's rate: how many jobs may start per period, in bursts of how
many, across every process that runs it. The claim decides (jobs_step_one,
migration 025) from a row of job_rates it locks, so starting more processes
never raises the rate; queues that name one key share one rate. A worker
declares its queues' rates at start (lib/operate/queue_state.py)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Rate:
    """At most `limit` jobs started every `per` seconds in the long run, and
    at most `burst` at once after a quiet spell: in any window of w seconds,
    at most burst + limit * w / per starts."""

    limit: int
    per: float = 1.0
    burst: int = 1
    # Queues naming one key share one rate (one API key behind both); None:
    # the queue's own, under the queue's name.
    key: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 1:
            raise ValueError(f"a rate's limit must be a whole number of jobs, at least 1: {self.limit!r}")
        if not isinstance(self.per, int | float) or isinstance(self.per, bool) or not math.isfinite(self.per):
            raise ValueError(f"a rate's period must be a number of seconds: {self.per!r}")
        if self.per <= 0:
            raise ValueError(f"a rate's period must be positive: {self.per!r}")
        if isinstance(self.burst, bool) or not isinstance(self.burst, int) or self.burst < 1:
            raise ValueError(f"a rate's burst must be a whole number of jobs, at least 1: {self.burst!r}")
        if self.key is not None and not isinstance(self.key, str):
            raise ValueError(f"a rate's key must be a string: {self.key!r}")

    @property
    def spacing(self) -> float:
        """Seconds between starts at the long-run rate."""
        return self.per / self.limit

    def key_of(self, queue: str) -> str:
        return self.key if self.key is not None else queue

    def __str__(self) -> str:
        return f"{self.limit} per {self.per:g}s, bursts of {self.burst}"


def check_shared(rates: Iterable[tuple[str, Rate]]) -> None:
    """Refuse queues that name one key with different rates: which one holds
    would depend on which worker started last."""
    seen: dict[str, tuple[str, Rate]] = {}
    for queue, rate in rates:
        key = rate.key_of(queue)
        first = seen.setdefault(key, (queue, rate))
        if (first[1].limit, first[1].per, first[1].burst) != (rate.limit, rate.per, rate.burst):
            raise ValueError(
                f"queues {first[0]} and {queue} share the rate key {key!r} with different rates: {first[1]} and {rate}"
            )
