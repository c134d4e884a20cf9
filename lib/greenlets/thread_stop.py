"""A stop signal that the hub's thread sets and a native thread waits on."""

from __future__ import annotations

import gevent.monkey

_native_lock = gevent.monkey.get_original("_thread", "allocate_lock")


class ThreadStop:
    """A native lock, held until set: a native thread's wait between rounds
    sleeps its period and ends the moment the worker stops, and neither side
    touches the hub. A timed lock wait, not time.sleep, which raises where
    the time functions are interposed (libfaketime's clock_nanosleep) and
    would end the thread unseen."""

    def __init__(self) -> None:
        self._held = _native_lock()
        self._held.acquire()
        self._set = False

    def set(self) -> None:
        if not self._set:
            self._set = True
            self._held.release()

    def is_set(self) -> bool:
        return self._set

    def wait(self, seconds: float) -> bool:
        """Wait up to seconds, or until set; whether it is set."""
        if self._held.acquire(timeout=max(0.0, seconds)):
            self._held.release()  # every later wait ends at once too
            return True
        return self._set
