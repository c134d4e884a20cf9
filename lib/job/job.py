"""The job a handler is given, the types of a handler and a throttle, and the
Snooze a handler raises when it cannot work yet."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lib.job import status as st
from lib.job.text import describe, safe_text

# The kinds of outcome a follow-up may be written with: the job's answers.
# A fault (err:) is retried or reported, never followed up.
FOLLOW_KINDS = frozenset({st.Kind.OK, st.Kind.FAIL, st.Kind.SKIP})


@dataclass(frozen=True)
class FollowUp:
    """A job to enqueue when the one that adds it ends (PendingJob.then)."""

    queue: str
    name: str
    args: Any = None
    run_at: Any = None  # a timezone-aware datetime, or None: due at once
    priority: int = 0
    max_attempts: int | None = None
    key: str | None = None
    when: frozenset[st.Kind] = frozenset({st.Kind.OK})
    after: tuple[int, ...] = ()  # jobs it waits for (insert's after=)
    after_any_outcome: bool = False


@dataclass(frozen=True)
class PendingJob:
    id: int
    name: str
    args: Any
    attempts: int = 1
    max_attempts: int = 1
    callsite: str | None = None
    latency: float = 0.0
    # When the claim's reply came back (monotonic): the lease holds from about then.
    claimed_at: float = 0.0
    # Why the stored args could not be read (too large, undecodable); the
    # handler is then not called.
    args_error: str | None = None
    # The queue's budgets, which spent() reports to (lib/run/budget.py);
    # None: the queue has none.
    budgets: Any = field(default=None, repr=False, compare=False)
    # What spent() has reported so far, by unit.
    reported: dict[str, float] = field(default_factory=dict, repr=False, compare=False)
    # The jobs then() added, written with this job's outcome.
    followups: list[FollowUp] = field(default_factory=list, repr=False, compare=False)
    # Where step() keeps results (lib/run/job_steps.py), given with the claim;
    # None: a job made outside a worker (a handler's unit test), whose steps
    # run every time.
    step_store: Any = field(default=None, repr=False, compare=False)
    # The results this run has read and stored, by step name: None until its
    # first step(), so a job that calls none costs no query.
    step_results: dict[str, Any] | None = field(default=None, init=False, repr=False, compare=False)
    # The enqueuer's trace context as stored (JSON text; None: untraced), which
    # the run's span links to (lib/run/traces.py).
    trace: str | None = field(default=None, repr=False, compare=False)

    def then(
        self,
        queue: str,
        name: str,
        args: Any = None,
        *,
        run_at: Any = None,
        priority: int = 0,
        max_attempts: int | None = None,
        key: str | None = None,
        when: str | tuple[str, ...] = "ok",
        after: tuple[int, ...] | list[int] = (),
        after_any_outcome: bool = False,
    ) -> None:
        """Enqueue a job when this one ends, with the options of insert. It is
        written in the transaction that stores this job's outcome, so it
        exists exactly when that outcome does: a worker killed at any moment
        leaves neither without the other, and a run that never stores its
        outcome (a retry, a rescue) adds nothing. when: the outcomes that
        write it, "ok" (the default), "fail" or "skip", or several; a fault
        never does. after and after_any_outcome: as for insert. The job's
        fields are checked when the handler returns: a bad one fails this
        job, saying which."""
        kinds = {when} if isinstance(when, str) else set(when)
        wanted = frozenset(k for k in FOLLOW_KINDS if k.value in kinds)
        if not wanted or len(wanted) != len(kinds):
            raise ValueError(f"then(when=...) takes 'ok', 'fail' or 'skip', or several, not {when!r}")
        follow = FollowUp(
            queue, name, args, run_at, priority, max_attempts, key, wanted, tuple(after), after_any_outcome
        )
        self.followups.append(follow)

    def step(self, name: str, fn: Callable[[], Any]) -> Any:
        """fn(), once per job: its result is stored (as JSON, in a transaction
        of its own) as soon as it returns, and a later run of this job (a
        retry, a run after its worker died) gets the stored result back
        without calling fn. Use it for work that must not be paid for twice,
        such as an API call billed by the token. The result is what a later
        run reads back, on this run too: JSON's types (a tuple comes back a
        list, a dict's keys strings).

        fn's own exception goes on up, and nothing is stored. A name that is
        not a non-empty string of at most 200 characters, or a result that
        JSON cannot hold (a set, NaN) or that is over 256 KiB as compact
        JSON, fails the job for good, naming the step. When the database
        fails while the result is stored, that error goes on up like any
        other (the job is retried): fn ran, and its result was not kept, so
        the next run calls it again; so does one whose worker died between
        fn's return and the store."""
        store = self.step_store
        if store is None:
            return fn()
        if self.step_results is None:
            # The job is frozen for its handler; what this run has read is its own to keep.
            object.__setattr__(self, "step_results", store.read(self.id))
        return store.step(self.id, self.step_results, name, fn)

    def spent(self, **units: float) -> None:
        """What this job spent of its queue's budgets (tokens_in=1200,
        tokens_out=350), reported as soon as it is known: the first report of
        a unit settles what the claim reserved (giving back what was not
        used), a later one adds to it. Nothing on a queue without budgets;
        ValueError for a unit the queue has no budget of."""
        if self.budgets is not None:
            self.budgets.spend(self, units)

    def limits_left(self, **units: int | None) -> None:
        """What the API says is left of each budget's limit now (its
        remaining headers, tokens_in=12000): the budget takes it as spent at
        least the rest, so every process claims within what the API will
        take, whoever else spends the key. None, or a unit the queue has
        no budget of: nothing (an API reports limits a queue need not
        budget). The API queues (lib/run/api_queue.py) report it from every
        answer their client reads it from (APIClient.LIMITS_LEFT)."""
        if self.budgets is not None:
            self.budgets.follow(self, {unit: n for unit, n in units.items() if n is not None})


Handler = Callable[[PendingJob], str]
# (status, error or None, seconds the job took) -> seconds to pause. Pure.
Throttle = Callable[[str, BaseException | None, float], float]


class Snooze(Exception):
    """Raised by a handler that cannot do its work yet (its API's rate limit is
    exhausted, say): the job returns to pending for `seconds`, the attempt is
    not counted, nothing is reported, and the status says why.

    hold_queue: the limit is the queue's, not the job's (an API key's rate
    limit): the job keeps its place at the head of its queue, and the queue
    takes no job for `seconds`, in any process."""

    def __init__(self, seconds: float, status: str, *, hold_queue: bool = False) -> None:
        if st.kind(status) is not st.Kind.SKIP:
            raise ValueError(f"a snoozed job's status is a skip, not {status!r}")
        # A plain float here, raised to the handler otherwise: the group
        # commit's batch takes no other kind, and a batch fails as a whole.
        value = real_seconds(seconds, "Snooze seconds")
        if not math.isfinite(value):
            raise ValueError(f"Snooze seconds must be finite, not {value!r}")
        status = safe_text(status)
        super().__init__(status)
        self.seconds = max(0.0, value)
        self.status = status
        self.hold_queue = hold_queue


def real_seconds(value: object, what: str) -> float:
    """value as a plain float: a Decimal, a Fraction, a numpy scalar, anything
    float() reads as a number (NaN and infinity too). TypeError for what is no
    number (a bool, a string, None); ValueError for one no float can hold."""
    kind = type(value)
    if isinstance(value, bool) or (kind.__module__ == "numpy" and kind.__name__ in ("bool", "bool_")):
        raise TypeError(f"{what} must be a number, not a bool")
    if isinstance(value, str | bytes | bytearray) or not (hasattr(kind, "__float__") or hasattr(kind, "__index__")):
        raise TypeError(f"{what} must be a number, not {safe_text(kind.__name__)}")
    try:
        return float(value)  # type: ignore[arg-type]
    except (OverflowError, ValueError) as exc:
        raise ValueError(f"{what} must be a number a float can hold: {describe(exc)}") from None
