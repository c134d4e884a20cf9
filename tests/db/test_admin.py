"""The admin page over HTTP: the token on every request, the session cookie,
CSRF on every state-changing POST, and the actions' effects on the rows.
The same page in a real browser is tests/system/test_admin_browser.py."""

import re
from contextlib import contextmanager

import pytest
import requests
from factory import make_job
from http_support import serving
from proxy import Proxy

import lib.http.admin
from lib.http import metrics
from lib.http.admin import Admin
from lib.http.health import Health
from lib.http.httpd import make_app
from lib.operate import overview
from lib.store.db import DB

TOKEN = "admin-" + "t0ken" * 5


@contextmanager
def admin_site(db, **options):
    admin = Admin(db, TOKEN, queue_stats=overview.queue_stats, workers=overview.workers, queues=["mail"], **options)
    with serving(make_app(Health(db), metrics.registry(), admin=admin)) as base:
        yield base


@pytest.fixture(autouse=True)
def _no_login_penalty(monkeypatch):
    monkeypatch.setattr(lib.http.admin, "LOGIN_PENALTY", 0.0)


def log_in(base: str) -> requests.Session:
    session = requests.Session()
    answer = session.post(f"{base}/admin/login", data={"token": TOKEN}, allow_redirects=False)
    assert answer.status_code == 303 and answer.headers["Location"] == "/admin/"
    return session


def csrf_of(session: requests.Session, base: str) -> str:
    page = session.get(f"{base}/admin/").text
    return re.search(r'name="csrf" value="([0-9a-f]+)"', page).group(1)


def failed_job(db, queue="mail", name="mail.Send", error="err: RuntimeError: smtp down") -> int:
    return make_job(db, queue, name, {"to": "a@example.com"}, status=error, max_attempts=1).id


def test_no_credentials_no_page(db):
    with admin_site(db) as base:
        answer = requests.get(f"{base}/admin/failures", allow_redirects=False, timeout=5)
        assert (answer.status_code, answer.headers["Location"]) == (303, "/admin/login")
        assert requests.post(f"{base}/admin/pause", data={"queue": "mail"}, timeout=5).status_code == 401
        for header in (f"Bearer {TOKEN}x", f"Basic {TOKEN}", "Bearer ", TOKEN):
            answer = requests.get(f"{base}/admin/", headers={"Authorization": header}, timeout=5)
            assert answer.status_code == 401, header
    assert not db.query("SELECT * FROM job_queues")


def test_a_bearer_token_opens_every_page_and_needs_no_csrf(db):
    job_id = failed_job(db)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with admin_site(db) as base:
        for path in ("/admin/", "/admin", "/admin/failures?queue=mail", f"/admin/jobs/{job_id}", "/admin/workers"):
            answer = requests.get(f"{base}{path}", headers=auth, timeout=5)
            assert answer.status_code == 200, path
            assert answer.headers["Content-Type"] == "text/html; charset=utf-8"
        # A browser never sends this header by itself: no request forged by another site carries it.
        answer = requests.post(f"{base}/admin/retry", data={"id": job_id}, headers=auth, allow_redirects=False)
        assert answer.status_code == 303
    assert db.query_row("SELECT status FROM jobs WHERE id = %s", (job_id,))[0] == "pending"


def test_the_login_sets_a_strict_http_only_cookie_that_is_not_the_token(db, caplog):
    with admin_site(db) as base:
        wrong = requests.post(f"{base}/admin/login", data={"token": "guess-" * 4}, timeout=5)
        assert wrong.status_code == 403 and "wrong token" in wrong.text
        assert "Set-Cookie" not in wrong.headers
        answer = requests.post(f"{base}/admin/login", data={"token": TOKEN}, allow_redirects=False, timeout=5)
        cookie = answer.headers["Set-Cookie"]
        assert cookie.startswith("jobs_admin=")
        assert {"HttpOnly", "SameSite=Strict", "Path=/admin"} <= {p.strip() for p in cookie.split(";")}
        assert TOKEN not in cookie
        page = requests.get(f"{base}/admin/", cookies={"jobs_admin": answer.cookies["jobs_admin"]}, timeout=5)
        assert page.status_code == 200 and "<h1>Queues</h1>" in page.text
        assert TOKEN not in page.text
    assert "guess-" not in caplog.text and TOKEN not in caplog.text


def test_a_forged_or_expired_session_is_sent_to_log_in(db):
    admin = Admin(db, TOKEN, queue_stats=overview.queue_stats, workers=overview.workers)
    other = Admin(db, "another-" + TOKEN, queue_stats=overview.queue_stats, workers=overview.workers)
    expired = "1.00ff." + admin._sign("session:1.00ff")
    with serving(make_app(Health(db), metrics.registry(), admin=admin)) as base:
        for value in ("x", "9999999999.00ff.0000", expired, other._new_session()):
            answer = requests.get(f"{base}/admin/", cookies={"jobs_admin": value}, allow_redirects=False, timeout=5)
            assert answer.status_code == 303, value


def test_a_post_without_the_sessions_csrf_token_is_refused(db):
    with admin_site(db) as base:
        session = log_in(base)
        other = log_in(base)
        for data in ({}, {"csrf": ""}, {"csrf": "0" * 64}, {"csrf": csrf_of(other, base)}):
            answer = session.post(f"{base}/admin/pause", data={"queue": "mail", "reason": "x", **data})
            assert answer.status_code == 403, data
            assert "CSRF" in answer.text
        assert not db.query("SELECT * FROM job_queues")
        answer = session.post(
            f"{base}/admin/pause", data={"queue": "mail", "reason": "x", "csrf": csrf_of(session, base)}
        )
        assert answer.status_code == 200 and "paused mail until resumed: x" in answer.text
    assert db.query_row("SELECT pause_reason FROM job_queues WHERE queue = 'mail'")[0] == "x"


def test_pause_for_minutes_resume_and_what_a_pause_needs(db):
    with admin_site(db) as base:
        session = log_in(base)
        csrf = csrf_of(session, base)
        for form, said in (
            ({"reason": " "}, "needs a reason"),
            ({"reason": "x", "minutes": "0"}, "minutes above 0"),
            ({"reason": "x", "minutes": "nan"}, "minutes above 0"),
            ({"reason": "x", "minutes": "a lot"}, "minutes above 0"),
        ):
            page = session.post(f"{base}/admin/pause", data={"queue": "mail", "csrf": csrf, **form}).text
            assert "not paused" in page and said in page, form
        assert not db.query("SELECT * FROM job_queues")
        page = session.post(
            f"{base}/admin/pause", data={"queue": "mail", "csrf": csrf, "reason": "deploy", "minutes": "30"}
        )
        assert "paused mail until 20" in page.text
        (left,) = db.query_row("SELECT extract(EPOCH FROM paused_until - now()) FROM job_queues WHERE queue = 'mail'")
        assert 29 * 60 < left <= 30 * 60
        page = session.post(f"{base}/admin/resume", data={"queue": "mail", "csrf": csrf}).text
        assert "resumed mail" in page
        assert db.query_row("SELECT paused_until FROM job_queues WHERE queue = 'mail'") == (None,)
        # The message is shown once.
        assert "resumed mail" not in session.get(f"{base}/admin/").text


def test_retry_by_row_by_filter_and_never_everything(db):
    first, second = failed_job(db, name="mail.Send"), failed_job(db, name="mail.Send")
    other = failed_job(db, name="mail.Bounce")
    with admin_site(db) as base:
        session = log_in(base)
        csrf = csrf_of(session, base)
        page = session.post(f"{base}/admin/retry", data={"csrf": csrf}).text
        assert "filter by queue or name" in page
        assert db.query_row("SELECT count(*) FROM jobs WHERE status = 'pending'")[0] == 0
        answer = session.post(f"{base}/admin/retry", data={"csrf": csrf, "name": "mail.Send"}, allow_redirects=False)
        assert answer.headers["Location"] == "/admin/failures?name=mail.Send"
        page = session.get(f"{base}{answer.headers['Location']}").text
        assert f"retried 2 jobs: {first}, {second}" in page
        # Back to the page the button was on, never to another site.
        answer = session.post(
            f"{base}/admin/retry",
            data={"csrf": csrf, "id": other, "back": "https://elsewhere.example/"},
            allow_redirects=False,
        )
        assert answer.headers["Location"] == "/admin/failures"
    assert db.query("SELECT status FROM jobs ORDER BY id") == [("pending",)] * 3


def test_pages_send_a_strict_content_security_policy_and_are_not_cached(db):
    with admin_site(db) as base:
        answer = requests.get(f"{base}/admin/", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
    csp = answer.headers["Content-Security-Policy"]
    nonce = re.search(r"script-src 'nonce-([^']+)'", csp).group(1)
    assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp
    # The page's only script and style carry this response's nonce.
    assert answer.text.count(f'nonce="{nonce}"') == 2
    assert answer.headers["Cache-Control"] == "no-store"
    assert answer.headers["X-Frame-Options"] == "DENY"


def test_unknown_pages_and_jobs(db):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with admin_site(db) as base:
        assert requests.get(f"{base}/admin/nope", headers=auth, timeout=5).status_code == 404
        assert requests.get(f"{base}/admin/jobs/12345", headers=auth, timeout=5).status_code == 404
        assert requests.get(f"{base}/admin/jobs/x", headers=auth, timeout=5).status_code == 404
        assert requests.get(f"{base}/admin/jobs/99999999999999999999", headers=auth, timeout=5).status_code == 404
        assert requests.put(f"{base}/admin/", headers=auth, timeout=5).status_code == 405
        big = requests.post(f"{base}/admin/retry", headers=auth, data={"id": "1" * 70000}, timeout=5)
        assert big.status_code == 400


def test_a_page_asked_while_the_database_is_down_is_a_503_not_a_report(database_url, sentry_events):
    proxy = Proxy(database_url)
    db = DB.connect(proxy.url, size=2, connect_timeout=2)
    try:
        with admin_site(db) as base:
            auth = {"Authorization": f"Bearer {TOKEN}"}
            assert requests.get(f"{base}/admin/failures", headers=auth, timeout=5).status_code == 200
            proxy.down()
            answer = requests.get(f"{base}/admin/failures", headers=auth, timeout=10)
            assert (answer.status_code, answer.text) == (503, "database unreachable; try again shortly\n")
            proxy.up()
    finally:
        db.close()
        proxy.close()
    assert sentry_events == []
