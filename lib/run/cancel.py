"""An operator's cancel of a running job (`worker.py cancel`, the admin page),
as the executor carries it out: the handler is thrown JobCancelled at once,
and again every few tenths of a second while it goes on, as a job timeout
is (lib/greenlets/deadline.py). Each throw is made from the hub, where the
check that the slot still runs that job and the throw cannot be split by a
switch: a handler that has just returned is left alone."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import gevent

from lib.job import PendingJob


class JobCancelled(BaseException):
    """Thrown into a handler whose job an operator cancelled. A BaseException,
    as JobTimeout and LeaseLost are, so a handler's `except Exception` retry
    loop does not take it for one more fault to retry."""

    def __init__(self, by: str) -> None:
        super().__init__(f"cancelled by {by}")
        self.by = by


@dataclass
class _Asked:
    job: PendingJob
    by: str
    timer: Any  # the hub loop's timer that throws


class Cancels:
    """The cancel asked of each slot's job, if any. running: the executor's
    slot -> (job, greenlet) of the handlers running now."""

    def __init__(self, running: Mapping[int, tuple[PendingJob, Any]], again_every: float) -> None:
        self._running = running
        self.again_every = again_every
        # Read by the executor on every job's path, a dict's look-up and no
        # call: an ordinary job's walk gains no move (tests/db/test_walk.py).
        self.asked: dict[int, _Asked] = {}

    def ask(self, slot: int, job: PendingJob, by: str) -> None:
        """Stop the slot's handler of job; in the hub's thread. A job whose
        handler has not begun yet never begins (asked)."""
        asked = self.asked.get(slot)
        if asked is not None:
            if asked.job is job:
                return
            asked.timer.close()  # an earlier job's, whose cancel came too late
        timer = gevent.get_hub().loop.timer(0.0, self.again_every)
        self.asked[slot] = _Asked(job, by, timer)
        timer.start(self._throw, slot)

    def done(self, slot: int, job: PendingJob) -> str | None:
        """The slot's handler of job is about to begin, or has ended: nothing
        more is thrown into it. Who asked to cancel the job, if anyone did."""
        asked = self.asked.pop(slot, None)
        if asked is None:
            return None
        asked.timer.close()
        return asked.by if asked.job is job else None

    def _throw(self, slot: int) -> None:
        # Run by the hub, at once and every again_every seconds after.
        asked = self.asked.get(slot)
        if asked is None:
            return
        running = self._running.get(slot)
        if running is None or running[0] is not asked.job:
            # Its handler has not begun (it never will) or has ended.
            asked.timer.stop()
            return
        running[1].throw(JobCancelled(asked.by))
