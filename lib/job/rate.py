"""A queue's rate: how many jobs may start per period, in bursts of how
many, across every process that runs it. The claim decides (jobs_step_one,
sql/rules/rates.sql) from a row of job_rates it locks, so starting more processes
never raises the rate; queues that name one key share one rate. A worker
declares its queues' rates at start (lib/run/rates.py)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any


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


@dataclass(frozen=True)
class Budget:
    """At most `limit` units (an API's input tokens, say) spent in any `per`
    seconds, across every process: a token bucket of `limit` units refilled
    at limit / per a second. A claim reserves `most`, the most one job of the
    queue spends, so the jobs running at once never overdraw it; the job
    reports what it spent (PendingJob.spent), which settles its reservation
    and frees what it did not use. A job that spends more than `most` can
    overdraw it by the difference, and the log says so."""

    unit: str
    limit: int
    per: float
    most: int
    # Queues naming one key share their rate and budgets (one API key
    # behind both); None: the queue's rate's key, or the queue's name.
    key: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.unit, str) or not self.unit.isidentifier():
            raise ValueError(f"a budget's unit is a name such as tokens_in: {self.unit!r}")
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 1:
            raise ValueError(f"budget {self.unit}: its limit must be a whole number, at least 1: {self.limit!r}")
        if not isinstance(self.per, int | float) or isinstance(self.per, bool) or not math.isfinite(self.per):
            raise ValueError(f"budget {self.unit}: its period must be a number of seconds: {self.per!r}")
        if self.per <= 0:
            raise ValueError(f"budget {self.unit}: its period must be positive: {self.per!r}")
        if isinstance(self.most, bool) or not isinstance(self.most, int) or not 1 <= self.most <= self.limit:
            raise ValueError(
                f"budget {self.unit}: most, the most a job spends, is a whole number from 1 to its limit: {self.most!r}"
            )
        if self.key is not None and not isinstance(self.key, str):
            raise ValueError(f"budget {self.unit}: its key must be a string: {self.key!r}")

    @property
    def spacing(self) -> float:
        """Seconds the bucket takes to refill one unit."""
        return self.per / self.limit

    def __str__(self) -> str:
        return f"{self.limit:,} {self.unit} per {self.per:g}s, {self.most:,} reserved a job"


def limits_key(queue: str, rate: Rate | None, budgets: Sequence[Budget]) -> str:
    """The key a queue's rate and budgets are kept under (job_rates' group);
    ValueError when they name different keys."""
    named = {k for k in [rate.key if rate else None, *(b.key for b in budgets)] if k is not None}
    if len(named) > 1:
        raise ValueError(f"queue {queue}: its rate and budgets name different keys: {sorted(named)}")
    if len({b.unit for b in budgets}) < len(budgets):
        raise ValueError(f"queue {queue}: two budgets of one unit")
    return named.pop() if named else queue


def budget_key(group: str, unit: str) -> str:
    """A budget's row in job_rates: the group's key and the unit."""
    return f"{group}/{unit}"


def check_shared(limits: Iterable[tuple[str, Rate | None, Sequence[Budget]]]) -> None:
    """Refuse queues that name one key with different rates or budgets:
    which one holds would depend on which worker started last."""
    seen: dict[str, tuple[str, Any]] = {}
    for queue, rate, budgets in limits:
        key = limits_key(queue, rate, budgets)
        said = (
            None if rate is None else (rate.limit, rate.per, rate.burst),
            sorted((b.unit, b.limit, b.per, b.most) for b in budgets),
        )
        first = seen.setdefault(key, (queue, said))
        if first[1] != said:
            raise ValueError(f"queues {first[0]} and {queue} share the key {key!r} with different rates or budgets")
