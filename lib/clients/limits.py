"""What an API's answers say is left of the key's limits, for the queue's
budgets (lib/run/api_queue.py hands them to PendingJob.limits_left).

A client names the header of each limit it reads (APIClient.LIMITS_LEFT,
unit -> header). The caller asks with a dict to fill, for the requests
sent inside `telling`; a client serves every slot of its queue, so the dict
is the sending thread's (a greenlet's, once the worker patched threading)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

_asked = threading.local()


@contextmanager
def telling(left: dict[str, int]) -> Iterator[dict[str, int]]:
    """Within the block, each answer's remaining counts go into left."""
    _asked.left = left
    try:
        yield left
    finally:
        _asked.left = None


def note(headers: Mapping[str, str], names: Mapping[str, str]) -> None:
    """The remaining counts in an answer's headers, by unit, into the dict
    the sender is telling (nothing when none)."""
    left = getattr(_asked, "left", None)
    if left is None:
        return
    for unit, header in names.items():
        value = headers.get(header, "").strip()
        if value.isdigit():
            left[unit] = int(value)
