"""Kills held back while a greenlet is in a section that must not be cut.

An outcome's write is one: cut in the middle, its batch goes down with it
(every outcome and claim in it left unanswered), and a claim it made for the
slot's next job is never given back. The write runs in the poller's own
greenlet, as the rest of the job does; the shutdown kills pollers through
these Kills, and a poller inside a section is killed as it leaves it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gevent
from greenlet import GreenletExit, getcurrent


class Kills:
    def __init__(self) -> None:
        # The greenlets in a section now, each with whether a kill waits for it.
        self._inside: dict[Any, bool] = {}

    def __enter__(self) -> None:
        """A section of the current greenlet (sections do not nest)."""
        self._inside[getcurrent()] = False

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if self._inside.pop(getcurrent()) and (kind is None or issubclass(kind, Exception)):
            # The kill held back comes now, in the place of whatever the
            # section raised (it stays the GreenletExit's context).
            raise GreenletExit

    def kill(self, greenlets: Sequence[gevent.Greenlet], timeout: float | None = None) -> None:
        """Kill each greenlet, at once or as it leaves its section, and wait
        up to timeout for all of them to end."""

        def throw() -> None:
            # From the hub, where the look at a greenlet's section and the
            # throw cannot be split by a switch that enters or leaves one.
            for greenlet in greenlets:
                if greenlet.dead:
                    continue
                if greenlet in self._inside:
                    self._inside[greenlet] = True
                elif greenlet:
                    greenlet.throw(GreenletExit)
                else:
                    greenlet.kill(block=False)  # not started yet: it never will

        gevent.get_hub().loop.run_callback(throw)
        gevent.joinall(greenlets, timeout=timeout)
