"""The admin page's one gate for wrong credentials, shared by every request
of the process: a wrong bearer token, a wrong token on the login form, and a
session cookie whose signature is not the page's (whoever guesses the token
can sign a cookie with it, so such a cookie tests a guess as surely as the
header does).

A wrong credential's answer waits its turn: one at a time, each holding the
gate for the penalty, so N sent at once from anywhere are answered over N
penalties, and the connections they came on are held that long. At most
PLACES wait; past that, each request that presents a credential is turned
away at once without it being read, so that it tells a guesser nothing and
a flood leaves connections to the rest of the server. So however a guesser
sends, and even one that stops waiting for the answers, at most PLACES
credentials are read at once and one more each penalty. Only the waiting
requests and one run's counts are kept: nothing grows with the number of
clients.

Each run of wrong credentials is one warning when it starts and, when more
than one came, one with its counts when it ends (a run that goes on is
counted again every REPORT_EVERY), never a line per guess.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field

import gevent
from gevent.lock import Semaphore

from lib.http.capped_server import MAX_CONNECTIONS

log = logging.getLogger("jobs.admin")

# Seconds each wrong credential holds the gate: the process answers at most
# one wrong credential a PENALTY, however many come at once.
PENALTY = 1.0
# Wrong credentials waiting their turn at most: half the server's
# connections, so a flood of guesses leaves the other half to /healthz,
# /metrics and the operator.
PLACES = MAX_CONNECTIONS // 2
# A run of wrong credentials ends once none has come or waited this long.
QUIET = 60.0
# A run that goes on is reported again this often, with its counts so far.
REPORT_EVERY = 600.0
# The client addresses a run names at most; past them a run says "and others".
ADDRESSES_KEPT = 20

# The kinds a run counts.
BEARER = "wrong bearer token"
LOGIN = "wrong login token"
FORGED = "forged session cookie"
TURNED_AWAY = "turned away unread"


@dataclass
class Run:
    """The wrong credentials since the gate was last quiet, counted by kind
    (TURNED_AWAY: those that found every place taken)."""

    started: float
    last: float
    kinds: Counter[str] = field(default_factory=Counter)
    addresses: dict[str, None] = field(default_factory=dict)  # the first ADDRESSES_KEPT, in order
    more_addresses: bool = False

    def note(self, kind: str, address: str) -> None:
        self.kinds[kind] += 1
        self.last = time.monotonic()
        if address in self.addresses:
            return
        if len(self.addresses) < ADDRESSES_KEPT:
            self.addresses[address] = None
        else:
            self.more_addresses = True

    def summary(self) -> str:
        kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(self.kinds.items()))
        addresses = ", ".join(self.addresses) + (" and others" if self.more_addresses else "")
        return f"{self.kinds.total()} in {self.last - self.started:.0f}s ({kinds}) from {addresses}"


class Guesses:
    """The gate. The worker builds one admin page, so one gate a process."""

    def __init__(self) -> None:
        # Read when the gate is built, so that a test, or a test's worker, may set them first.
        self.penalty, self.places, self.quiet = PENALTY, PLACES, QUIET
        self._turn = Semaphore()
        self._waiting = 0
        self.run: Run | None = None

    @property
    def waiting(self) -> int:
        """Wrong credentials waiting their turn now, the one holding the gate included."""
        return self._waiting

    def full(self) -> bool:
        """Every place is taken: a request that presents a credential is to be
        turned away (turned_away) before the credential is read."""
        return self._waiting >= self.places

    def turned_away(self, address: str) -> None:
        self._note(TURNED_AWAY, address)

    def wait_turn(self, kind: str, address: str) -> None:
        """Returns once this wrong credential's answer may go: after every one
        that came before it, and the penalty. Blocks only the calling
        greenlet. The caller must hold no database connection: it would be
        held for as long as the whole queue of guesses takes."""
        self._note(kind, address)
        self._waiting += 1
        try:
            with self._turn:
                gevent.sleep(self.penalty)
        finally:
            self._waiting -= 1
            if self.run is not None:
                self.run.last = time.monotonic()

    def _note(self, kind: str, address: str) -> None:
        if self.run is None:
            self.run = Run(started=time.monotonic(), last=time.monotonic())
            log.warning(
                "admin: %s from %s; wrong credentials are answered one per %gs from now on,"
                " and counted until %gs pass without one",
                kind,
                address,
                self.penalty,
                self.quiet,
            )
            # Not supervised: it lives for one run and only reports it; the gate
            # spaces wrong credentials without it.
            gevent.spawn(self._watch, self.run)
        self.run.note(kind, address)

    def _watch(self, run: Run) -> None:
        """Ends the run once no wrong credential has come or waited for
        `quiet` seconds, with its counts; reports one that goes on every
        REPORT_EVERY."""
        reported = run.started
        while True:
            now = time.monotonic()
            if self._waiting == 0 and now - run.last >= self.quiet:
                break
            if now - reported >= REPORT_EVERY:
                log.warning("admin: wrong credentials go on: %s so far", run.summary())
                reported = now
            # Never less than a tenth of quiet: while one waits longer than
            # quiet (a penalty that long), this must not spin.
            gevent.sleep(max(min(run.last + self.quiet, reported + REPORT_EVERY) - now, self.quiet / 10))
        self.run = None
        if run.kinds.total() > 1:
            log.warning("admin: wrong credentials stopped: %s", run.summary())
