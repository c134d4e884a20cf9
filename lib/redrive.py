"""Redrive: give failed jobs another attempt."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lib.sql import Q


def redrive(
    db: Any,
    *,
    ids: Sequence[int] | None = None,
    queue: str | None = None,
    name: str | None = None,
) -> list[int]:
    """Return failed (err:) jobs matching every filter given to pending, due
    now, with one more attempt allowed; their last_error stays as the record of
    what went wrong. The ids redriven. At least one filter is required, so a
    slip cannot redrive every failure ever kept."""
    if ids is None and queue is None and name is None:
        raise ValueError("redrive needs ids, a queue or a name")
    params = {"ids": list(ids) if ids is not None else None, "queue": queue, "name": name}
    return sorted(row[0] for row in db.query(Q.job_redrive, params))
