"""A time limit for a with-block that runs once a job (the handler's, the
group commit's round trip), on one timer made once and restarted for each
block. A gevent.Timeout is made anew for each use: a Python object, a
watcher on the hub's loop, and the same freed again, on every job. A libev
timer stopped and then started again keeps what was left of its first
deadline, so the timer is restarted with libev's again, which counts the
full time from now."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gevent


class Expired(BaseException):
    """A Deadline's block ran out of time. A BaseException, as gevent.Timeout
    is, so no `except Exception` inside the block takes it for its own."""


class Deadline:
    __slots__ = ("_again", "_greenlet", "_made_for", "_timer", "again_every", "error", "expired", "seconds")

    def __init__(
        self, seconds: float, error: Callable[[], BaseException] = Expired, *, again_every: float | None = None
    ) -> None:
        """A block that lasts seconds is thrown error() where it waits; the
        exception is made only then, so it carries that place's traceback.
        With again_every, a block that goes on after that (it caught the
        error) is thrown a new error() every again_every seconds until it ends."""
        self.seconds = seconds
        self.error = error
        self.again_every = again_every
        # The first error thrown into the block running now, or into the last one.
        self.expired: BaseException | None = None
        self._timer: Any = None
        self._made_for = 0.0
        self._greenlet: Any = None
        # The throws after the first: a timer of its own, since a libev timer's
        # period is fixed when it is made. Made at the first expiry, if any.
        self._again: Any = None

    def __enter__(self) -> None:
        if self._greenlet is not None:
            raise RuntimeError("a Deadline's block was entered again before it ended")
        timer = self._timer
        if timer is None or self._made_for != self.seconds:
            # Made at first use, so on the loop of the hub that runs the block.
            timer = self._timer = gevent.get_hub().loop.timer(self.seconds, self.seconds)
            self._made_for = self.seconds
        self._greenlet = gevent.getcurrent()
        self.expired = None
        timer.again(self._expired)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        self._timer.stop()
        if self._again is not None:
            self._again.stop()
        # From here the hub throws nothing more into the greenlet.
        self._greenlet = None

    def _expired(self) -> None:
        # Run by the hub; a repeating timer, so it is stopped before anything else.
        self._timer.stop()
        greenlet = self._greenlet
        if greenlet is None:
            return
        if self.again_every is None:
            self._greenlet = None
        else:
            if self._again is None:
                self._again = gevent.get_hub().loop.timer(self.again_every, self.again_every)
            # Repeating: libev starts it over after each throw.
            self._again.again(self._throw_again)
        self.expired = self.error()
        greenlet.throw(self.expired)

    def _throw_again(self) -> None:
        greenlet = self._greenlet
        if greenlet is not None:
            greenlet.throw(self.error())
