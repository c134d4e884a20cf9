"""The jobs list: every job, newest first, filtered by state, queue, name and
a created_at range, searched by id, name prefix or args, a page at a time,
with a count per state.

Pages go by id (`before=<id>`: the rows below the last one shown), never by
OFFSET, so the hundredth page costs what the first does. Each count stops at
COUNT_CAP rows ("10,000+"). A page's list and counts share PAGE_BUDGET_MS
of statement time: the list first, then the counts, cheapest first; a count
that would overrun what is left shows the planner's estimate instead
("≈ 10,700"), which costs only the planning. So a page never reads millions
of rows to count them, however narrow or rare its filter, and the list is
always shown.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from lib.http.admin.filters import BadFilter, is_text, moment, parse_id, readable
from lib.http.web import Request
from lib.job import status as st
from lib.store.sql import Q

# The states an operator filters by, in the order the page shows them; the
# outcomes are the status kinds of lib.job.status a finished job has.
STATES = ("pending", "scheduled", "retrying", "running", "failed", "done")
OUTCOMES = ("ok", "fail", "skip", "err")
PAGE_SIZE = 50
COUNT_CAP = 10_000
# A page's list and counts together: the list first, whatever it takes; a
# count starts only with at least MIN_COUNT_MS of the budget left. The bulk
# preview's one count has the whole budget.
PAGE_BUDGET_MS = 40
MIN_COUNT_MS = 2
COUNT_TIMEOUT_MS = 500
LIST_TIMEOUT_MS = 5000
# A time window this narrow is read through jobs_created, a wider one newest first.
NARROW_WINDOW = timedelta(days=1)
# The live states and the failures first: partial indexes of their own keep
# them cheap under any filter, and the planner's estimate of a few pending
# rows among millions is poor (it takes their filters as independent). The
# finished kinds last: under a narrow filter they read many rows, and their
# large numbers are what the planner estimates well. err counts the failed
# rows: err: is how a job fails.
COUNT_ORDER = ("running", "pending", "scheduled", "failed", "retrying", "all", "done", "ok", "fail", "skip")
# The planner's estimate of a count, read from EXPLAIN's JSON.
ESTIMATE = "EXPLAIN (FORMAT JSON) "


@dataclass(frozen=True)
class Filters:
    """The jobs list's filters as the URL carries them (text, as typed)."""

    state: str | None = None
    queue: str | None = None
    name: str | None = None
    q: str | None = None  # the search box: an id, a name prefix or a JSON object
    since: str | None = None
    until: str | None = None
    before: str | None = None

    def query(self, **changes: str | None) -> str:
        """The URL query of these filters with some changed ("" when none)."""
        values = {k: v for k, v in asdict(replace(self, **changes)).items() if v}
        return f"?{urlencode(values)}" if values else ""

    def any(self) -> bool:
        return any(v for k, v in asdict(self).items() if k != "before")


def read(request: Request) -> Filters:
    return Filters(**{name: request.arg(name) for name in Filters.__dataclass_fields__})


def job_id(filters: Filters) -> int | None:
    """The job a search names by its number ("42" or "#42"), else None."""
    return parse_id((filters.q or "").removeprefix("#"))


def params(filters: Filters, now: datetime | None = None) -> dict[str, Any]:
    """The named queries' parameters; BadFilter with what is wrong."""
    readable(asdict(filters))
    if filters.state is not None and filters.state not in STATES + OUTCOMES:
        raise BadFilter(f"no state {filters.state!r}: one of {', '.join(STATES + OUTCOMES)}")
    before = parse_id(filters.before)
    if filters.before is not None and before is None:
        raise BadFilter("before is a job id")
    prefix, args = None, None
    q = filters.q
    if q is not None and job_id(filters) is None:
        if q.startswith("{"):
            args = _args_search(q)
        else:
            prefix = q
    now = now or datetime.now(UTC)
    since = moment(filters.since, "created after", now)
    until = moment(filters.until, "created before", now)
    return {
        "state": filters.state,
        "queue": filters.queue,
        "name": filters.name,
        "prefix": prefix,
        "args": args,
        "since": since,
        "until": until,
        "by_created": since is not None and until is not None and until - since <= NARROW_WINDOW,
        "before": before,
    }


def _args_search(text: str) -> str | None:
    """A search for args that contain a JSON object, as the jsonb text to send;
    None for {}, which every job's args contain (and no index can narrow)."""

    def refuse(constant: str) -> None:
        raise BadFilter(f"args search: {constant} is not JSON")

    def finite(number: str) -> float:
        # 1e999 reads as inf, which json.dumps writes as Infinity: no JSON either.
        value = float(number)
        if not math.isfinite(value):
            raise BadFilter(f"args search: {number[:40]} is beyond a double")
        return value

    try:
        value = json.loads(text, parse_constant=refuse, parse_float=finite)
    except json.JSONDecodeError as exc:
        where = f"{exc.msg} at character {exc.pos + 1}"
        raise BadFilter(f'args search: not JSON ({where}); such as {{"customer_id": 42}}') from None
    except RecursionError:
        raise BadFilter("args search: nested too deep") from None
    if not isinstance(value, dict):
        raise BadFilter('args search: a JSON object, such as {"customer_id": 42}')
    if not value:
        return None
    sent = json.dumps(value, ensure_ascii=False)
    if "\\u0000" in sent:
        # Postgres's jsonb holds no NUL character: no job's args can contain one.
        raise BadFilter("args search: jsonb holds no \\u0000")
    if not is_text(sent):
        # A JSON "\ud800" with no pair decodes to a lone surrogate, which no encoding sends.
        raise BadFilter("args search: a \\u escape of half a character (a lone surrogate)")
    return sent


@dataclass(frozen=True)
class Row:
    id: int
    queue: str
    name: str
    status: str
    attempts: int
    max_attempts: int | None
    run_at: datetime
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    state: str


def state_of(status: str, attempts: int, erred: bool, run_at: datetime, now: datetime) -> str:
    """The state the pages show for a row: the filter it falls under
    (admin_job_list's state filter is the same rule), or its status's kind."""
    if status == st.PENDING:
        if attempts > 0 and erred:
            return "retrying"
        return "scheduled" if run_at > now else "pending"
    if status == st.STARTED:
        return "running"
    return status.split(": ", 1)[0]


def page(db: Any, values: dict[str, Any]) -> tuple[list[Row], str | None]:
    """One page of rows, and the `before` of the next page (None: the last)."""
    with db.transaction() as tx:
        tx.exec(f"SET LOCAL statement_timeout = {LIST_TIMEOUT_MS}")
        found = tx.query(Q.admin_job_list, {**values, "limit": PAGE_SIZE + 1})
    now = datetime.now(UTC)
    rows = [Row(*r[:-1], state=state_of(r[3], r[4], r[-1], r[6], now)) for r in found]
    more = len(rows) > PAGE_SIZE
    rows = rows[:PAGE_SIZE]
    return rows, (str(rows[-1].id) if more else None)


@dataclass(frozen=True)
class Counts:
    """Each state's rows under the other filters: counted up to COUNT_CAP + 1
    (more than the cap), or estimated (the states in `about`); None: neither."""

    n: dict[str, int | None]
    about: frozenset[str] = frozenset()

    def __getitem__(self, state: str) -> int | None:
        return self.n[state]

    def __bool__(self) -> bool:
        return bool(self.n)


def counts(db: Any, values: dict[str, Any], budget_ms: float) -> Counts:
    """Every state's count within budget_ms of statement time, the rest estimated."""
    found: dict[str, int | None] = {}
    about: set[str] = set()
    left = budget_ms
    for state in COUNT_ORDER:
        asked = {**values, "state": None if state == "all" else state}
        counted = None
        if left >= MIN_COUNT_MS:
            began = time.monotonic()
            counted = count_one(db, asked, COUNT_CAP, timeout_ms=int(left))
            left -= (time.monotonic() - began) * 1000
        if counted is None:
            counted = estimate(db, asked)
            about.add(state)
        found[state] = counted
    found["err"] = found["failed"]
    if "failed" in about:
        about.add("err")
    return Counts(found, frozenset(about))


def estimate(db: Any, values: dict[str, Any]) -> int | None:
    """The planner's estimate of the rows of values' state under its other
    filters: the rows the plan expects below its count; None if it cannot say."""
    try:
        with db.transaction() as tx:
            tx.exec(f"SET LOCAL statement_timeout = {COUNT_TIMEOUT_MS}")
            (doc,) = tx.query_row(ESTIMATE + Q.admin_job_count, {**values, "cap": None})
    except Exception as exc:
        if not timed_out(exc):
            raise
        return None
    plan = (json.loads(doc) if isinstance(doc, str) else doc)[0]["Plan"]
    below = plan.get("Plans") or [plan]
    return round(below[0]["Plan Rows"])


def count_one(db: Any, values: dict[str, Any], cap: int, timeout_ms: int | None = None) -> int | None:
    """The rows of values' state under its other filters, up to cap + 1 (more
    than the cap); None when the timeout (COUNT_TIMEOUT_MS unless given) cut the count short."""
    try:
        with db.transaction() as tx:
            tx.exec(f"SET LOCAL statement_timeout = {max(1, timeout_ms or COUNT_TIMEOUT_MS)}")
            # One row past the cap tells "exactly the cap" from "more".
            return tx.query_row(Q.admin_job_count, {**values, "cap": cap + 1})[0]
    except Exception as exc:
        if not timed_out(exc):
            raise
        return None


def timed_out(exc: BaseException) -> bool:
    """The server stopped the statement at its statement_timeout (query_canceled)."""
    return getattr(exc, "pgcode", None) == "57014"
