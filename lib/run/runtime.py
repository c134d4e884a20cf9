"""What a worker's pollers share: the lease keeper (its worker id, lease
length, renewal and fence), the report of a database outage, the kills that
wait out an outcome's write, the completer, and the cap on their fallback poll."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from lib.background.leases import Leases
from lib.greenlets.kills import Kills
from lib.run.steps import Committer
from lib.setup.error_reports import Outage
from lib.store.db import DB


@dataclass(frozen=True)
class Runtime:
    leases: Leases
    # What the write and claim stages hand their asks to: an outcome to
    # write, a claim to make, or both in one round trip and one commit.
    completer: Committer
    # One report for an outage of the database, whichever part meets it;
    # None: each poller reports its own.
    outage: Outage | None = None
    # The shutdown kills pollers through these, so that a kill at the end of
    # the shutdown window never cuts an outcome's write in half.
    kills: Kills = field(default_factory=Kills)
    # The longest a poller sleeps between looks at its queue: shorter when no
    # LISTEN wakes it.
    poll_interval: float | None = None
    # The job names of every queue the worker defines, which a follow-up may
    # name (PendingJob.then); None: any name goes (pollers without a worker).
    known: Mapping[str, frozenset[str]] | None = None

    @classmethod
    def alone(
        cls, db: DB, *, worker_id: str | None = None, lease: float | None = None, outage: Outage | None = None
    ) -> Runtime:
        """A runtime of pollers that run without a worker (a script, a test):
        their own lease keeper and group commit on db. The pollers built on
        it share both, as a worker's do; pollers on two runtimes do not."""
        leases = Leases(db, worker_id=worker_id) if lease is None else Leases(db, worker_id=worker_id, lease=lease)
        return cls(leases, Committer(db), outage=outage)
