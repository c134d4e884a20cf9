"""Backoff between attempts: of a failed job (a pure function of the
attempt), and of the loops that retry until the database answers again.
Both retry against the database (a failed job's next try is a later run_at
on its row), so it sits in the store, where the store's own loops (the
listener, the migration lock) reach it too."""

from __future__ import annotations

import random

BASE_SECONDS = 10.0
CAP_SECONDS = 3600.0


def backoff(
    attempt: int,
    *,
    base: float = BASE_SECONDS,
    cap: float = CAP_SECONDS,
    rand: float | None = None,
) -> float:
    """Seconds to wait after the given (1-based) failed attempt.

    Capped exponential with "equal jitter": half the step is fixed, half is
    random, so retries of jobs that failed together spread out yet never come
    back sooner than half the step. rand in [0, 1) may be passed for a test.
    """
    if attempt < 1:
        raise ValueError(f"attempt counts from 1, got {attempt}")
    step = min(cap, base * 2 ** min(attempt - 1, 32))
    r = random.random() if rand is None else rand
    return step / 2 + step / 2 * r


class Backoff:
    """The waits of a loop that retries until it succeeds (a connection, a
    claim): backoff() of the failures in a row, from base up to cap, starting
    over after a success. The jitter spreads the retries of processes that
    lost the same server at the same moment."""

    def __init__(self, base: float = 1.0, cap: float = 30.0) -> None:
        self.base = base
        self.cap = cap
        self.failures = 0

    def failed(self) -> float:
        """Seconds to wait before the next try."""
        self.failures += 1
        return backoff(self.failures, base=self.base, cap=self.cap)

    def succeeded(self) -> None:
        self.failures = 0
