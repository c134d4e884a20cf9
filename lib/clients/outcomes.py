"""The outcome vocabulary of the API clients: what a queue does about an
API's answer, and the per-API tables from an answer to an outcome.

Which outcome an answer becomes is each client's ``OUTCOMES`` table (status,
or status and the API's error code, to an ``Outcome``); ``table_text()``
renders a table for a queue's docstring.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from enum import StrEnum
from typing import Any


class Outcome(StrEnum):
    """What a queue does about an API's answer (lib/run/api_queue.py)."""

    RATE_LIMIT = "rate_limit"  # snooze the job until the limit resets
    BAD_TOKEN = "bad_token"  # pause the queue for an hour, one report
    BAD_INPUT = "bad_input"  # fail: no report, no retry
    TRANSIENT = "transient"  # retry with backoff, counted, one report per run
    FAULT = "fault"  # err, reported


# A table's key: a status, or a status and the API's error code (the more
# specific one wins).
OutcomeKey = int | tuple[int, str]
OutcomeTable = Mapping[OutcomeKey, Outcome]

# The server errors both GitHub and Apollo document: a request that may be
# repeated is tried again.
SERVER_ERRORS: dict[OutcomeKey, Outcome] = {status: Outcome.TRANSIENT for status in (500, 502, 503, 504)}

# Methods HTTP defines as idempotent: sent twice, they do what once does.
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})


def table_outcome(table: OutcomeTable, status: int, code: str | None = None) -> Outcome:
    """The outcome table says for status (and code); a status not in it is
    transient from 500 up, a fault below."""
    if code is not None and (status, code) in table:
        return table[(status, code)]
    if status in table:
        return table[status]
    return Outcome.TRANSIENT if status >= 500 else Outcome.FAULT


def table_text(table: Mapping[Any, Outcome]) -> str:
    """table as the lines a queue's docstring shows: each outcome, its keys."""
    lines: list[str] = []
    for outcome in Outcome:
        keys = ", ".join(str(key) for key, o in table.items() if o is outcome)
        if keys:
            lines += textwrap.wrap(f"- {outcome}: {keys}", 79, subsequent_indent="  ", break_on_hyphens=False)
    return "\n".join(lines)
