"""The admin page under /admin/: the queues, the jobs (browse, search, one
job and its actions), the failures (retry them), pause and resume, the
workers. Server-side HTML from the Jinja2 templates beside this file,
autoescaped; no script but a few lines that reload the queues table. This module
holds the login and the routes; the jobs list and one job's page are worked
out in jobs.py and job.py, the queues and failures pages' forms in
actions.py, and what every page shares in render.py.

On only when JOBS_ADMIN_TOKEN is set. Every request presents the token: as
`Authorization: Bearer <token>` (scripts), or as the session cookie the login
form sets, which holds no token but a signed expiry. Cookie-authenticated
POSTs also carry a CSRF token bound to that session; a bearer header needs
none, since a browser never sends one by itself.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote

import gevent

from lib.http.admin import job as one_job
from lib.http.admin import jobs
from lib.http.admin.actions import pause_queue, retry_failures
from lib.http.admin.render import (
    FLASH,
    PREFIX,
    SECURITY_HEADERS,
    cookie,
    csp,
    done,
    environment,
)
from lib.http.web import BadRequest, Environ, Request, Response, StartResponse, redirect, text
from lib.operate import overview
from lib.operate.queue_state import resume
from lib.store.sql import Q

log = logging.getLogger("jobs.admin")

COOKIE = "jobs_admin"
SESSION_SECONDS = 12 * 3600
# Seconds between reloads of the queues table.
REFRESH = 5.0
# Failures shown at once, newest first; a retry of the filtered set takes all.
FAILURES_SHOWN = 100
# A wrong token costs this long: guessing by the thousand becomes slow.
LOGIN_PENALTY = 1.0

# /jobs/<id>, and /jobs/<id>/<action> for a POST.
_JOB_PATH = re.compile(r"^/jobs/(\d{1,19})(?:/(cancel|run-now|retry))?$")

Stats = Callable[..., Sequence[Any]]


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


class Admin:
    def __init__(
        self,
        db: Any,
        token: str,
        *,
        queue_stats: Stats,
        workers: Stats,
        queues: Iterable[str] = (),
        refresh: float = REFRESH,
    ) -> None:
        if not token:
            raise ValueError("the admin page needs a token")
        self.db = db
        self._token_digest = _digest(token)
        # Signs sessions and CSRF tokens; derived, so neither reveals the token,
        # and a new token ends every session.
        self._key = hashlib.sha256(b"jobs-admin-key:" + token.encode()).digest()
        self.queue_stats = queue_stats
        self.workers = workers
        self.queues = sorted(set(queues))
        self.refresh = refresh
        self.env = environment()

    # -- auth

    def _token_ok(self, given: str | None) -> bool:
        # Digests of equal length, compared in constant time: neither the
        # token's characters nor its length leak through the timing.
        return given is not None and hmac.compare_digest(_digest(given), self._token_digest)

    def _sign(self, text: str) -> str:
        return hmac.new(self._key, text.encode(), hashlib.sha256).hexdigest()

    def _new_session(self) -> str:
        expires = int(time.time()) + SESSION_SECONDS
        nonce = secrets.token_hex(8)
        body = f"{expires}.{nonce}"
        return f"{body}.{self._sign('session:' + body)}"

    def _session(self, request: Request) -> str | None:
        """The request's session cookie when it is ours and unexpired."""
        value = request.cookie(COOKIE)
        if not value or value.count(".") != 2:
            return None
        body, sig = value.rsplit(".", 1)
        if not hmac.compare_digest(sig, self._sign("session:" + body)):
            return None
        expires = body.split(".", 1)[0]
        if not expires.isdigit() or int(expires) < time.time():
            return None
        return value

    def _csrf(self, session: str) -> str:
        return self._sign("csrf:" + session)

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
        bearer = request.header("Authorization")
        if bearer is not None:
            scheme, _, given = bearer.partition(" ")
            if scheme.lower() != "bearer" or not self._token_ok(given.strip()):
                return text(401, "unauthorized: bad bearer token")
            session = None
        else:
            session = self._session(request)
            if session is None:
                if request.method in ("GET", "HEAD"):
                    return redirect(f"{PREFIX}/login")
                return text(401, "unauthorized: log in first")
        if request.method == "POST":
            # A form another site makes the browser send carries the cookie
            # (not with SameSite=Strict, but older browsers) and never the token.
            if session is not None and not hmac.compare_digest(request.field("csrf") or "", self._csrf(session)):
                return text(403, "forbidden: missing or bad CSRF token; reload the page and try again")
            return self._post(path, request, session)
        if request.method not in ("GET", "HEAD"):
            return text(405, "method not allowed")
        page = self._get(path, request, session)
        return page if page is not None else self._missing(request, session, "There is no such page.")

    # -- pages

    def _page(
        self, template: str, request: Request, session: str | None, *, status: int = 200, **values: Any
    ) -> Response:
        nonce = secrets.token_urlsafe(12)
        flash = unquote(request.cookie(FLASH) or "")
        body = self.env.get_template(template).render(
            csrf=self._csrf(session) if session else "",
            logged_in=session is not None,
            nonce=nonce,
            flash=flash,
            prefix=PREFIX,
            **values,
        )
        headers = [("Content-Security-Policy", csp(nonce))]
        if flash:
            headers.append(("Set-Cookie", cookie(FLASH, "", max_age=0)))
        return Response(status, body, "text/html; charset=utf-8", headers)

    def _missing(self, request: Request, session: str | None, message: str) -> Response:
        return self._page("missing.html", request, session, status=404, message=message)

    def _get(self, path: str, request: Request, session: str | None) -> Response | None:
        if path == "/":
            rows = self.queue_stats(self.db, self.queues)
            return self._page("queues.html", request, session, stats=rows, refresh=self.refresh)
        if path == "/jobs":
            return self._jobs(request, session)
        if path == "/failures":
            queue, name = request.arg("queue"), request.arg("name")
            rows = self.db.query(Q.job_failed_list, {"queue": queue, "name": name, "limit": FAILURES_SHOWN})
            return self._page(
                "failures.html",
                request,
                session,
                rows=rows,
                queue=queue,
                name=name,
                shown=FAILURES_SHOWN,
                queues=self.queues,
            )
        found = _JOB_PATH.match(path)
        if found and not found.group(2):
            return self._job(int(found.group(1)), request, session)
        if path.startswith("/jobs/"):
            return self._missing(request, session, "A job's page is /admin/jobs/ and its number.")
        if path == "/workers":
            return self._page("workers.html", request, session, workers=self.workers(self.db))
        return None

    def _jobs(self, request: Request, session: str | None) -> Response:
        filters = jobs.read(request)
        target = jobs.job_id(filters)
        if target is not None:
            return redirect(f"{PREFIX}/jobs/{target}")
        values: dict[str, Any] = {"filters": filters, "states": jobs.STATES, "outcomes": jobs.OUTCOMES}
        values |= {"queues": self.queues, "cap": jobs.COUNT_CAP, "count_timeout": f"{jobs.COUNT_TIMEOUT_MS / 1000:g}s"}
        values |= {"rows": [], "next": None, "counts": {}}
        try:
            params = jobs.params(filters)
        except jobs.BadFilter as exc:
            return self._page("jobs.html", request, session, status=400, error=str(exc), **values)
        try:
            values["rows"], values["next"] = jobs.page(self.db, params)
        except Exception as exc:
            if not jobs.timed_out(exc):
                raise
            error = f"the list took over {jobs.LIST_TIMEOUT_MS / 1000:g}s; narrow it by state, queue or time"
            return self._page("jobs.html", request, session, error=error, **values)
        values["counts"] = jobs.counts(self.db, params)
        return self._page("jobs.html", request, session, error=None, **values)

    def _job(self, job_id: int, request: Request, session: str | None) -> Response:
        job = overview.job(self.db, job_id) if job_id < 2**63 else None
        if job is None:
            return self._missing(request, session, f"There is no job {job_id}: it never was, or it was deleted.")
        shown = one_job.shown(job, datetime.now(UTC))
        return self._page("job.html", request, session, job=shown, secret_words=one_job.SECRET_WORDS)

    def _login(self, request: Request) -> Response:
        if request.method == "POST":
            if self._token_ok(request.field("token")):
                log.info("admin login from %s", request.environ.get("REMOTE_ADDR"))
                session = cookie(COOKIE, self._new_session(), max_age=SESSION_SECONDS)
                return redirect(f"{PREFIX}/", [("Set-Cookie", session)])
            log.warning("admin login refused from %s: wrong token", request.environ.get("REMOTE_ADDR"))
            gevent.sleep(LOGIN_PENALTY)
            return self._page("login.html", request, None, status=403, error="wrong token")
        if request.method not in ("GET", "HEAD"):
            return text(405, "method not allowed")
        return self._page("login.html", request, None, error=None)

    # -- actions

    def _post(self, path: str, request: Request, session: str | None) -> Response:
        if path == "/logout":
            return redirect(f"{PREFIX}/login", [("Set-Cookie", cookie(COOKIE, "", max_age=0))])
        if path == "/retry":
            return retry_failures(self.db, request)
        found = _JOB_PATH.match(path)
        if found and found.group(2) and int(found.group(1)) < 2**63:
            return self._act(int(found.group(1)), found.group(2), session)
        if path in ("/pause", "/resume"):
            queue = request.field("queue")
            if queue is None:
                return text(400, "bad request: which queue?")
            if path == "/resume":
                resumed = resume(self.db, queue)
                log.info("admin resumed queue=%s", queue)
                return done(f"{PREFIX}/", f"resumed {queue}" if resumed else f"{queue} was not paused")
            return pause_queue(self.db, queue, request)
        return text(404, "not found")

    def _act(self, job_id: int, action: str, session: str | None) -> Response:
        """One job's action, as one statement; logged with the operator's session."""
        operator = _operator(session)
        message = one_job.act(self.db, job_id, action, operator)
        log.info("admin %s job=%s by %s: %s", action, job_id, operator, message)
        return done(f"{PREFIX}/jobs/{job_id}", message)


def _operator(session: str | None) -> str:
    """Who acted, as far as the page knows: a short fingerprint of the session
    (not the cookie itself, which would let a reader of the log act as them),
    or the bearer token's script."""
    if session is None:
        return "bearer token"
    return "session " + hashlib.sha256(session.encode()).hexdigest()[:8]
