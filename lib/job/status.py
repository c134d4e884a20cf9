"""The one vocabulary of job statuses: build them here, read them here.

A handler returns ok/fail/skip for an expected outcome and raises for a fault;
the poller turns the fault into an err: status. Every count of outcomes goes
through kind(), so an expected answer is never counted as an error.
"""

from __future__ import annotations

from enum import StrEnum

from lib.job.text import safe_text

PENDING = "pending"
STARTED = "started"
INTERRUPTED = "err: interrupted"

# A status is stored in a text column that people read; a runaway exception
# message should not make it a blob.
MAX_LEN = 2000


class Kind(StrEnum):
    PENDING = "pending"
    STARTED = "started"
    OK = "ok"
    FAIL = "fail"
    SKIP = "skip"
    ERR = "err"


def _build(prefix: str, detail: str) -> str:
    # One line, and no NUL: Postgres text cannot hold one, and an API's error
    # body may carry one; the row must still take the status.
    detail = " ".join(str(detail).replace("\x00", "\\x00").split())
    if not detail:
        raise ValueError(f"a {prefix} status needs a reason")
    return f"{prefix}: {detail}"[:MAX_LEN]


def ok(detail: str | None = None) -> str:
    return "ok" if detail is None else _build("ok", detail)


def fail(reason: str) -> str:
    """The job ran and reached a negative answer that a retry does not change."""
    return _build("fail", reason)


def skip(reason: str) -> str:
    """There was nothing to attempt."""
    return _build("skip", reason)


def err(reason: str) -> str:
    """A fault. Handlers raise instead; the poller builds this from the exception."""
    return _build("err", reason)


def cancelled(by: str) -> str:
    """A job an operator cancelled (`worker.py cancel`, the admin page), pending
    or running; the rescue of a cancelled row writes the same (job_rescue)."""
    return _build("skip", f"cancelled by {by}")


RATE_LIMITED = "skip: rate limited"


def rate_limited(wait: float, detail: str) -> str:
    """A job that found its API's limit exhausted and comes back after wait
    seconds. A skip, never a fault: it is not counted as an error, and the
    queue's throttle reads the wait back with rate_limit_wait()."""
    return _build("skip", f"rate limited, resets in {max(0, round(wait))}s: {detail}")


def rate_limit_wait(status: str) -> float | None:
    """The seconds a rate_limited() status says to wait; None for any other status."""
    if not status.startswith(RATE_LIMITED + ", resets in "):
        return None
    number = status[len(RATE_LIMITED + ", resets in ") :].split("s", 1)[0]
    return float(number) if number.isdigit() else None


def clean(status: str) -> str:
    """A status a handler returned, as it is stored: rebuilt through the same
    rules as one built here (one line, no NUL, bounded length)."""
    prefix, sep, rest = status.partition(": ")
    return _build(prefix, rest) if sep else status


def returned(value: object) -> str:
    """A status a handler returned, as it is stored; ValueError saying why
    for anything else: not a string, not a status, or a fault (a fault is
    raised, so that it reaches someone)."""
    if value.__class__ is str and value == "ok":
        return "ok"  # the common answer, which needs no cleaning
    if not isinstance(value, str):
        raise ValueError(f"handler returned {type(value).__name__}, not a status string")
    # A plain str from here (a subclass's own methods are not called), one
    # that Postgres can store: no NUL, no lone surrogate.
    text = safe_text(value)
    try:
        found = kind(text)
    except ValueError:
        raise ValueError(f"handler returned {text!r:.100}, not a status") from None
    if found not in (Kind.OK, Kind.FAIL, Kind.SKIP):
        # A fault recorded without an exception would reach nobody.
        raise ValueError(f"handler returned {text!r:.100}; a fault must be raised")
    return clean(text)


# A status standing alone, and a prefix before ": ", by their text: a dict
# lookup, where Kind(text) goes through the enum's metaclass (twice a job).
_BARE = {k.value: k for k in (Kind.PENDING, Kind.STARTED, Kind.OK)}
_PREFIXES = {k.value: k for k in (Kind.OK, Kind.FAIL, Kind.SKIP, Kind.ERR)}


def kind(status: str) -> Kind:
    """The kind of any status string; ValueError for one outside the vocabulary."""
    bare = _BARE.get(status)
    if bare is not None:
        return bare
    prefix, sep, detail = status.partition(": ")
    found = _PREFIXES.get(prefix) if sep and detail else None
    if found is None:
        raise ValueError(f"not a job status: {status!r}")
    return found


def detail(status: str) -> str:
    """What follows the prefix ("" for a bare ok, pending or started)."""
    kind(status)
    return status.partition(": ")[2]
