"""The worker's own events for /metrics: jobs finished, retries, snoozes,
rescues, checkout waits. The poller, the pool and the lease keeper report
them here; lib.http.metrics counts them, into prometheus-client's objects, once it
is loaded, and the HTTP endpoints load it. A worker with JOBS_HTTP_ADDR=off
serves no metrics, so it never loads prometheus-client (a large share of an
idle worker's memory) to keep counts nobody can read.

Plain stdlib, and nothing here raises into its callers.
"""

from __future__ import annotations

from typing import Any

_counter: Any = None  # lib.http.metrics, once loaded


def counted_by(module: Any) -> None:
    """From now on, module (lib.http.metrics) counts what is reported here."""
    global _counter
    _counter = module


def job_done(queue: str, outcome: Any, seconds: float) -> None:
    """An attempt ended (lib.run.execute's Outcome)."""
    if _counter is not None:
        _counter.job_done(queue, outcome, seconds)


def rescued(queue: str) -> None:
    """A started row of a lost worker was taken back."""
    if _counter is not None:
        _counter.rescued(queue)


def checkout_waited(seconds: float) -> None:
    """A checkout of the pool waited this long for a connection."""
    if _counter is not None:
        _counter.checkout_waited(seconds)
