"""The admin page under /admin/: the queues, the failures (retry them), one
job, pause and resume, the workers. Server-side HTML from the Jinja2
templates beside this file, autoescaped; no script but a few lines that
reload the queues table.

On only when JOBS_ADMIN_TOKEN is set. Every request presents the token: as
`Authorization: Bearer <token>` (scripts), or as the session cookie the login
form sets, which holds no token but a signed expiry. Cookie-authenticated
POSTs also carry a CSRF token bound to that session; a bearer header needs
none, since a browser never sends one by itself.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlencode

import gevent
from jinja2 import Environment, FileSystemLoader, StrictUndefined

from lib.http.web import BadRequest, Environ, Request, Response, StartResponse, redirect, text
from lib.operate import overview
from lib.operate.queue_state import pause, resume
from lib.operate.redrive import redrive
from lib.store.sql import Q

log = logging.getLogger("jobs.admin")

PREFIX = "/admin"
COOKIE = "jobs_admin"
FLASH = "jobs_admin_flash"
SESSION_SECONDS = 12 * 3600
# Seconds between reloads of the queues table.
REFRESH = 5.0
# Failures shown at once, newest first; a retry of the filtered set takes all.
FAILURES_SHOWN = 100
# A wrong token costs this long: guessing by the thousand becomes slow.
LOGIN_PENALTY = 1.0
MAX_PAUSE_MINUTES = 525600  # a year, as the CLI

TEMPLATES = Path(__file__).resolve().parent / "templates"

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
        self.env = Environment(
            loader=FileSystemLoader(TEMPLATES),
            # Every value is escaped: job names, args and errors are written by whoever enqueues.
            autoescape=True,
            undefined=StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters.update(when=_when, ago=_ago, left=_left, seconds=overview.age)

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
        response.headers.extend(_SECURITY_HEADERS)
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
        return page if page is not None else text(404, "not found")

    # -- pages

    def _page(self, template: str, request: Request, session: str | None, **values: Any) -> Response:
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
        headers = [("Content-Security-Policy", _csp(nonce))]
        if flash:
            headers.append(("Set-Cookie", _cookie(FLASH, "", max_age=0)))
        return Response(200, body, "text/html; charset=utf-8", headers)

    def _get(self, path: str, request: Request, session: str | None) -> Response | None:
        if path == "/":
            rows = self.queue_stats(self.db, self.queues)
            return self._page("queues.html", request, session, stats=rows, refresh=self.refresh)
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
        if path.startswith("/jobs/"):
            job_id = path[len("/jobs/") :]
            if not job_id.isdigit() or not 0 < int(job_id) < 2**63:
                return None
            job = overview.job(self.db, int(job_id))
            if job is None:
                return text(404, f"no job {job_id}")
            return self._page("job.html", request, session, job=_shown(job))
        if path == "/workers":
            return self._page("workers.html", request, session, workers=self.workers(self.db))
        return None

    def _login(self, request: Request) -> Response:
        if request.method == "POST":
            if self._token_ok(request.field("token")):
                log.info("admin login from %s", request.environ.get("REMOTE_ADDR"))
                cookie = _cookie(COOKIE, self._new_session(), max_age=SESSION_SECONDS)
                return redirect(f"{PREFIX}/", [("Set-Cookie", cookie)])
            log.warning("admin login refused from %s: wrong token", request.environ.get("REMOTE_ADDR"))
            gevent.sleep(LOGIN_PENALTY)
            response = self._page("login.html", request, None, error="wrong token")
            response.status = 403
            return response
        if request.method not in ("GET", "HEAD"):
            return text(405, "method not allowed")
        return self._page("login.html", request, None, error=None)

    # -- actions

    def _post(self, path: str, request: Request, session: str | None) -> Response:
        if path == "/logout":
            return redirect(f"{PREFIX}/login", [("Set-Cookie", _cookie(COOKIE, "", max_age=0))])
        if path == "/retry":
            return self._retry(request)
        if path in ("/pause", "/resume"):
            queue = request.field("queue")
            if queue is None:
                return text(400, "bad request: which queue?")
            if path == "/resume":
                done = resume(self.db, queue)
                log.info("admin resumed queue=%s", queue)
                return _done(f"{PREFIX}/", f"resumed {queue}" if done else f"{queue} was not paused")
            return self._pause(queue, request)
        return text(404, "not found")

    def _retry(self, request: Request) -> Response:
        form = request.form()
        ids = [int(i) for i in form.get("id", []) if i.isdigit() and 0 < int(i) < 2**63]
        queue, name = request.field("queue"), request.field("name")
        back = f"{PREFIX}/failures" + (f"?{urlencode(_present(queue=queue, name=name))}" if queue or name else "")
        if ids:
            done = redrive(self.db, ids=ids)
        elif queue or name:
            done = redrive(self.db, queue=queue, name=name)
        else:
            # redrive refuses it too: a slip must not retry every failure ever kept.
            return _done(back, "choose jobs, or filter by queue or name, to retry a set")
        log.info("admin retried %s (queue=%s name=%s): %s", ids or "a set", queue, name, done.redriven)
        message = f"retried {len(done.redriven)} jobs" + (f": {_ids(done.redriven)}" if done.redriven else "")
        if done.skipped:
            message += f"; skipped {len(done.skipped)}: " + "; ".join(f"{i}: {w}" for i, w in done.skipped.items())
        # Back to the page the button was on (a job's page, say), never to another site.
        asked = request.field("back")
        return _done(asked if asked and asked.startswith(f"{PREFIX}/") else back, message)

    def _pause(self, queue: str, request: Request) -> Response:
        reason = request.field("reason")
        if reason is None or not reason.isprintable():
            return _done(f"{PREFIX}/", f"not paused: {queue} needs a reason an operator can read")
        minutes_text = request.field("minutes")
        until = None
        if minutes_text is not None:
            try:
                minutes = float(minutes_text)
            except ValueError:
                minutes = -1.0
            if not 0 < minutes <= MAX_PAUSE_MINUTES:
                return _done(f"{PREFIX}/", f"not paused: minutes above 0, at most {MAX_PAUSE_MINUTES}")
            until = datetime.now(UTC) + timedelta(minutes=minutes)
        pause(self.db, queue, reason, until)
        log.info("admin paused queue=%s until %s: %s", queue, until or "resumed", reason)
        return _done(f"{PREFIX}/", f"paused {queue} until {_when(until) if until else 'resumed'}: {reason}")


# The page loads nothing from elsewhere, runs only its own nonce'd script, and
# cannot be framed (a framed page could be clicked through by another site).
def _csp(nonce: str) -> str:
    return (
        f"default-src 'none'; style-src 'nonce-{nonce}'; script-src 'nonce-{nonce}'; "
        "img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    )


_SECURITY_HEADERS = [
    ("Cache-Control", "no-store"),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
]


def _cookie(name: str, value: str, *, max_age: int) -> str:
    # Not Secure: the page is plain HTTP on loopback, reached through an SSH
    # tunnel; a Secure cookie would never be sent back.
    return f"{name}={value}; Path={PREFIX}; Max-Age={max_age}; HttpOnly; SameSite=Strict"


def _done(location: str, message: str) -> Response:
    """Back to a page, which shows the message once."""
    return redirect(location, [("Set-Cookie", _cookie(FLASH, quote(message[:1000]), max_age=60))])


def _present(**values: str | None) -> dict[str, str]:
    return {k: v for k, v in values.items() if v}


def _ids(ids: list[int]) -> str:
    shown = ", ".join(map(str, ids[:20]))
    return shown + (f" and {len(ids) - 20} more" if len(ids) > 20 else "")


# The columns of job_get, in its order.
def _shown(job: dict[str, Any]) -> dict[str, Any]:
    """The job as the page shows it: args as indented JSON text."""
    return {**job, "args": json.dumps(job["args"], indent=2, ensure_ascii=False)}


# -- template filters


def _when(value: datetime | None) -> str:
    if value is None:
        return ""
    if value.year >= 9999:
        return "until resumed"  # a pause with no end is stored as infinity
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _ago(value: datetime | None) -> str:
    if value is None:
        return ""
    return overview.age((datetime.now(UTC) - value).total_seconds()) + " ago"


def _left(value: datetime | None) -> str:
    """How long until value, as a pause or a throttle reads: "for 25m"."""
    if value is None:
        return ""
    if value.year >= 9999:
        return "until resumed"
    return "for " + overview.age((value - datetime.now(UTC)).total_seconds())
