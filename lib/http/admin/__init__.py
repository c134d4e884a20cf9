"""The admin page under /admin/: the queues (each, with its charts), the
jobs (browse, search, one job and its actions, bulk retry and cancel), the
failures (retry them), pause and resume, the schedule, the workers, the
database's health. Server-side HTML from the Jinja2 templates beside this
file, autoescaped, charts as inline SVG; the only script is base.html's,
which polls /admin/live for a page's numbers. This module holds the login
and the routes; the read-only pages are worked out in views.py (queues.py,
timeline.py, schedule.py) and database.py, the jobs list and one job's page
in jobs.py and job.py, the bulk actions in bulk.py, the queues and failures
pages' forms in actions.py, and what every page shares in render.py.

On only when JOBS_ADMIN_TOKEN is set. Every request presents the token: as
`Authorization: Bearer <token>` (scripts), or as the session cookie the login
form sets, which holds no token but a signed expiry (session.py). A wrong
credential of any kind waits its turn at one gate for the whole process
(guesses.py). Cookie-authenticated POSTs also carry a CSRF token bound to
that session; a bearer header needs none, since a browser never sends one by
itself. A filter or form value the page cannot read is answered with the
page's "bad filter" message (filters.py), never an error.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote, urlencode

from lib.http.admin import bulk, jobs, views
from lib.http.admin import job as one_job
from lib.http.admin.actions import pause_queue, resume_queue, retry_failures, scale_queue
from lib.http.admin.database import database_page
from lib.http.admin.filters import BadFilter, readable
from lib.http.admin.guesses import LOGIN
from lib.http.admin.render import (
    FLASH,
    PREFIX,
    SECURITY_HEADERS,
    cookie,
    csp,
    done,
    environment,
)
from lib.http.admin.session import BUSY, COOKIE, SESSION_SECONDS, Sessions, busy_headers
from lib.http.web import BadRequest, Environ, Request, Response, StartResponse, redirect, text
from lib.operate import overview
from lib.store.driver_errors import is_lock_timeout
from lib.store.sql import Q

log = logging.getLogger("jobs.admin")

# Seconds between refreshes of a page's numbers.
REFRESH = 5.0
# Failures shown at once, newest first; a retry of the filtered set takes all.
FAILURES_SHOWN = 100

# /jobs/<id>, and /jobs/<id>/<action> for a POST.
_JOB_PATH = re.compile(r"^/jobs/(\d{1,19})(?:/(cancel|run-now|retry|retry-fresh))?$")
# The pages that answer a bad filter on their own form; every other page's
# arguments are read before the page is worked out.
_OWN_FILTERS = ("/jobs", "/jobs/bulk", "/failures")
# Where an action that found its row locked, or a value it could not read, sends the operator back to.
_BACK = {"/retry": "/failures", "/jobs/bulk": "/jobs"}
# How long an action's write waits for a row another transaction holds.
ACTION_LOCK_TIMEOUT_MS = 2000

Stats = Callable[..., Sequence[Any]]


class Admin(Sessions):
    def __init__(
        self,
        db: Any,
        token: str,
        *,
        queue_stats: Stats,
        workers: Stats,
        queues: Iterable[str] = (),
        concurrency: Mapping[str, int] | None = None,
        registered: Mapping[str, str | None] | None = None,
        schedule: Sequence[Any] = (),
        refresh: float = REFRESH,
    ) -> None:
        if not token:
            raise ValueError("the admin page needs a token")
        super().__init__(token)
        self.db = db
        # queues: those this worker runs; registered: every registered queue, with why it is off (None: on).
        self.site = views.Site.of(
            db, queue_stats, workers, queues=queues, registered=registered or {}, schedule=schedule
        )
        self.queues = sorted(self.site.registered)
        # The definitions' concurrency of the queues this worker runs: the
        # most the page may scale each to.
        self.concurrency = dict(concurrency or {})
        self.refresh = refresh
        self.env = environment()

    # -- dispatch

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        request = Request(environ)
        try:
            response = self._route(request)
        except BadRequest as exc:
            response = text(400, f"bad request: {exc}")
        response.headers.extend(SECURITY_HEADERS)
        return response(environ, start_response)

    def _route(self, request: Request) -> Response:
        path = request.path[len(PREFIX) :] or "/"
        if path == "/login":
            return self._login(request)
        refused, session = self._who(request, path)
        if refused is not None:
            return refused
        if request.method == "POST":
            # A form another site makes the browser send carries the cookie
            # (not with SameSite=Strict, but older browsers) and never the token.
            if session is not None and not hmac.compare_digest(request.field("csrf") or "", self._csrf(session)):
                return text(403, "forbidden: missing or bad CSRF token; reload the page and try again")
            return self._post(path, request, session)
        if request.method not in ("GET", "HEAD"):
            return text(405, "method not allowed")
        try:
            page = self._get(path, request, session)
        except BadFilter as exc:
            return self._page("missing.html", request, session, status=400, heading="Bad filter", message=str(exc))
        return page if page is not None else self._missing(request, session, "There is no such page.")

    # -- pages

    def _page(
        self, template: str, request: Request, session: str | None, *, status: int = 200, **values: Any
    ) -> Response:
        nonce = secrets.token_urlsafe(12)
        flash = unquote(request.cookie(FLASH) or "")
        live = values.setdefault("live", None)  # the page whose numbers /live refreshes, else no script
        asked = {"page": live, **({"queue": values["queue"]} if live == "queue" else {})}
        values["live_url"] = f"{PREFIX}/live?{urlencode(asked)}" if live else ""
        body = self.env.get_template(template).render(
            csrf=self._csrf(session) if session else "",
            logged_in=session is not None,
            nonce=nonce,
            flash=flash,
            prefix=PREFIX,
            refresh=self.refresh,
            **values,
        )
        headers = [("Content-Security-Policy", csp(nonce))]
        if flash:
            headers.append(("Set-Cookie", cookie(FLASH, "", max_age=0)))
        return Response(status, body, "text/html; charset=utf-8", headers)

    def _missing(self, request: Request, session: str | None, message: str) -> Response:
        return self._page("missing.html", request, session, status=404, heading="Not found", message=message)

    def _get(self, path: str, request: Request, session: str | None) -> Response | None:
        now = datetime.now(UTC)
        if path not in _OWN_FILTERS:
            readable(request.args())
        if path == "/":
            values = views.queues_page(self.site, request.arg("window"), now)
            return self._page("queues.html", request, session, live="queues", **values)
        if path == "/queue":
            return self._queue(request.arg("queue") or "", request, session, now)
        if path == "/schedule":
            return self._page("schedule.html", request, session, live="schedule", **views.schedule_page(self.site, now))
        if path == "/live":
            return self._live(request)
        if path == "/jobs":
            return self._jobs(request, session)
        if path == "/jobs/bulk":
            return self._bulk_preview(request, session)
        if path == "/failures":
            return self._failures(request, session)
        found = _JOB_PATH.match(path)
        if found and not found.group(2):
            return self._job(int(found.group(1)), request, session)
        if path.startswith("/jobs/"):
            return self._missing(request, session, "A job's page is /admin/jobs/ and its number.")
        if path == "/workers":
            return self._page("workers.html", request, session, live="workers", **views.workers_page(self.site))
        if path == "/database":
            return self._page("database.html", request, session, **database_page(self.db))
        return None

    def _queue(self, queue: str, request: Request, session: str | None, now: datetime) -> Response:
        values = views.queue_page(self.site, queue, now)
        if values is None:
            return self._missing(request, session, f"No queue {queue!r} is registered, run or has rows.")
        most = self.concurrency.get(queue)
        stats = values["row"].stats
        scale = None if most is None else {"most": most, "now": stats.scaled_to or most, "by": stats.scaled_by}
        return self._page("queue.html", request, session, live="queue", queue=queue, scale=scale, **values)

    def _failures(self, request: Request, session: str | None) -> Response:
        queue, name = request.arg("queue"), request.arg("name")
        values = {"queue": queue, "name": name, "shown": FAILURES_SHOWN, "queues": self.queues}
        try:
            readable({"queue": queue, "name": name})
        except BadFilter as exc:
            return self._page("failures.html", request, session, status=400, rows=[], error=str(exc), **values)
        rows = self.db.query(Q.job_failed_list, {"queue": queue, "name": name, "limit": FAILURES_SHOWN})
        return self._page("failures.html", request, session, rows=rows, error=None, **values)

    def _live(self, request: Request) -> Response:
        """A page's numbers as JSON, for its script to write in place."""
        page = request.arg("page") or ""
        if page not in views.LIVE_PAGES:
            return text(404, f"no live numbers for page {page[:100]!r}")
        numbers = views.live(self.site, page, request.arg("queue"))
        return Response(200, json.dumps({"numbers": numbers}), "application/json", [])

    def _bulk_preview(self, request: Request, session: str | None) -> Response:
        action = request.arg("action") or ""
        if action not in bulk.ACTIONS:
            return self._missing(request, session, "A bulk action is retry or cancel.")
        values: dict[str, Any] = {"action": action, "cap": bulk.BULK_CAP, "preview": None, "error": None}
        try:
            values["preview"] = bulk.preview(self.db, action, jobs.read(request))
        except BadFilter as exc:
            return self._page("bulk.html", request, session, status=400, **(values | {"error": str(exc)}))
        return self._page("bulk.html", request, session, **values)

    def _jobs(self, request: Request, session: str | None) -> Response:
        filters = jobs.read(request)
        target = jobs.job_id(filters)
        if target is not None:
            return redirect(f"{PREFIX}/jobs/{target}")
        values: dict[str, Any] = {"filters": filters, "states": jobs.STATES, "outcomes": jobs.OUTCOMES}
        values |= {"queues": self.queues, "cap": jobs.COUNT_CAP}
        values |= {"rows": [], "next": None, "counts": {}}
        try:
            params = jobs.params(filters)
        except BadFilter as exc:
            return self._page("jobs.html", request, session, status=400, error=str(exc), **values)
        began = time.monotonic()
        try:
            values["rows"], values["next"] = jobs.page(self.db, params)
        except Exception as exc:
            if not jobs.timed_out(exc):
                raise
            error = f"the list took over {jobs.LIST_TIMEOUT_MS / 1000:g}s; narrow it by state, queue or time"
            return self._page("jobs.html", request, session, error=error, **values)
        left = jobs.PAGE_BUDGET_MS - (time.monotonic() - began) * 1000
        values["counts"] = jobs.counts(self.db, params, left)
        return self._page("jobs.html", request, session, error=None, **values)

    def _job(self, job_id: int, request: Request, session: str | None) -> Response:
        job = overview.job(self.db, job_id) if job_id < 2**63 else None
        if job is None:
            return self._missing(request, session, f"There is no job {job_id}: it never was, or it was deleted.")
        steps, waits = overview.job_steps(self.db, job_id), overview.job_waits(self.db, job_id)
        shown = one_job.shown(job, steps, datetime.now(UTC), waits)
        return self._page("job.html", request, session, job=shown, secret_words=one_job.SECRET_WORDS)

    def _login(self, request: Request) -> Response:
        if request.method == "POST":
            # The body is read before full(): reading may yield, and nothing
            # between full() and wait_turn may, or more than PLACES could wait.
            given, address = request.field("token"), str(request.environ.get("REMOTE_ADDR") or "?")
            if self.guesses.full():
                self.guesses.turned_away(address)
                page = self._page("login.html", request, None, status=429, error=BUSY)
                page.headers.extend(busy_headers(self.guesses.penalty))
                return page
            if self._token_ok(given):
                log.info("admin login from %s", address)
                session = cookie(COOKIE, self._new_session(), max_age=SESSION_SECONDS)
                return redirect(f"{PREFIX}/", [("Set-Cookie", session)])
            self.guesses.wait_turn(LOGIN, address)
            return self._page("login.html", request, None, status=403, error="wrong token")
        if request.method not in ("GET", "HEAD"):
            return text(405, "method not allowed")
        return self._page("login.html", request, None, error=None)

    # -- actions

    def _post(self, path: str, request: Request, session: str | None) -> Response:
        """An action, its writes waiting at most ACTION_LOCK_TIMEOUT_MS for a
        row another transaction holds (_locked_out)."""
        try:
            return self._do(path, request, session, self.db.lock_bounded(ACTION_LOCK_TIMEOUT_MS))
        except BadFilter as exc:
            return done(_back_of(path), f"nothing done: {exc}")
        except Exception as exc:
            if not is_lock_timeout(exc):
                raise
            return _locked_out(path, session)

    def _do(self, path: str, request: Request, session: str | None, db: Any) -> Response:
        if path == "/logout":
            return redirect(f"{PREFIX}/login", [("Set-Cookie", cookie(COOKIE, "", max_age=0))])
        if path == "/retry":
            return retry_failures(db, request)
        if path == "/jobs/bulk":
            return _bulk(request, session, db)
        found = _JOB_PATH.match(path)
        if found and found.group(2) and int(found.group(1)) < 2**63:
            return _act(int(found.group(1)), found.group(2), session, db)
        if path == "/scale":
            return scale_queue(db, request, _operator(session), self.concurrency)
        if path in ("/pause", "/resume"):
            queue = request.field("queue")
            if queue is None:
                return text(400, "bad request: which queue?")
            if path == "/resume":
                return resume_queue(db, queue, request, _operator(session))
            pausable = {r.queue for r in self.site.queue_rows(datetime.now(UTC)) if r.pausable}
            return pause_queue(db, queue, request, _operator(session), pausable=pausable)
        return text(404, "not found")


def _bulk(request: Request, session: str | None, db: Any) -> Response:
    """A bulk action the preview asked for, on the filters it carried."""
    action = request.field("action") or ""
    filters = jobs.Filters(**{name: request.field(name) for name in jobs.Filters.__dataclass_fields__})
    back = f"{PREFIX}/jobs{bulk.filters_of(filters).query()}"
    if action not in bulk.ACTIONS:
        return done(back, "nothing done: a bulk action is retry or cancel")
    try:
        message = bulk.act(db, action, filters, _operator(session))
    except BadFilter as exc:
        return done(back, f"nothing done: {exc}")
    return done(back, message)


def _act(job_id: int, action: str, session: str | None, db: Any) -> Response:
    """One job's action, in one transaction; logged with the operator's session."""
    operator = _operator(session)
    message = one_job.act(db, job_id, action, operator)
    log.info("admin %s job=%s by %s: %s", action, job_id, operator, message)
    return done(f"{PREFIX}/jobs/{job_id}", message)


def _locked_out(path: str, session: str | None) -> Response:
    """An action that met a row another transaction held (a BEGIN left open
    in psql, say): nothing done, and the operator may try again; no request
    waits behind such a transaction."""
    log.warning("admin %s by %s: a row it writes is locked; nothing done", path, _operator(session))
    held = f"held by another transaction for over {ACTION_LOCK_TIMEOUT_MS / 1000:g}s"
    return done(_back_of(path), f"nothing done: a row it changes was {held}; try again")


def _back_of(path: str) -> str:
    """The page an action's outcome is shown on, when it has none of its own."""
    found = _JOB_PATH.match(path)
    return f"{PREFIX}/jobs/{found.group(1)}" if found else f"{PREFIX}{_BACK.get(path, '/')}"


def _operator(session: str | None) -> str:
    """Who acted, as far as the page knows: a short fingerprint of the session
    (not the cookie itself, which would let a reader of the log act as them),
    or the bearer token's script."""
    if session is None:
        return "bearer token"
    return "session " + hashlib.sha256(session.encode()).hexdigest()[:8]
