"""The admin page over HTTP: the token on every request, the session cookie,
CSRF on every state-changing POST, and the actions' effects on the rows;
the jobs list (filters, pages, counts, search) and one job's page with its
actions. The same page in a real browser is tests/system/test_admin_browser.py."""

import html
import json
import logging
import re
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import gevent
import psycopg2
import pytest
import requests
from factory import ago, later, make_job, make_jobs
from gevent.event import Event
from http_support import serving
from proxy import Proxy
from test_cancel_running import listening
from tests_support import make_poller

import lib.http.admin
import lib.http.admin.bulk
import lib.http.admin.guesses
import lib.http.admin.queues
from lib.background import worker_registry
from lib.background.clock import Scheduled, daily, every, weekdays
from lib.background.cron import cron
from lib.http import metrics
from lib.http.admin import Admin, jobs
from lib.http.health import Health
from lib.http.httpd import make_app
from lib.insert import insert
from lib.operate import overview
from lib.store.db import DB
from lib.store.sql import Q

TOKEN = "admin-" + "t0ken" * 5


@contextmanager
def admin_site(db, **options):
    admin = Admin(db, TOKEN, queue_stats=overview.queue_stats, workers=overview.workers, queues=["mail"], **options)
    with serving(make_app(Health(db), metrics.registry(), admin=admin)) as base:
        yield base


@pytest.fixture(autouse=True)
def _no_login_penalty(monkeypatch):
    monkeypatch.setattr(lib.http.admin.guesses, "PENALTY", 0.0)


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
    # The pause keeps who paused it: a fingerprint of the session, not the cookie.
    assert re.fullmatch(
        r"x \(session [0-9a-f]{8}, admin page\)", db.query_row("SELECT pause_reason FROM job_queues")[0]
    )


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
            assert (answer.status_code, answer.text) == (503, "database unavailable; try again shortly\n")
            proxy.up()
    finally:
        db.close()
        proxy.close()
    assert sentry_events == []


# -- the jobs list

AUTH = {"Authorization": f"Bearer {TOKEN}"}
XSS = "<img src=x onerror=alert(1)>\"'&"


def listed(base: str, query: str = "", **params: str) -> list[int]:
    """The ids the jobs list shows, in its order."""
    answer = requests.get(f"{base}/admin/jobs{query}", params=params, headers=AUTH, timeout=10)
    assert answer.status_code == 200, answer.text
    return [int(i) for i in re.findall(r'<tr data-id="(\d+)"', answer.text)]


def plant_states(db) -> dict[str, int]:
    """One job in each state the list tells apart, oldest first."""
    return {
        "pending": make_job(db, "mail", "mail.Send").id,
        "scheduled": make_job(db, "mail", "mail.Send", run_at=later(hours=1)).id,
        "retrying": make_job(
            db, "mail", "mail.Send", attempts=1, last_error="err: Timeout", run_at=later(minutes=1)
        ).id,
        # Back after a snooze: attempted, but nothing failed.
        "snoozed": make_job(db, "mail", "mail.Send", attempts=1, run_at=later(minutes=5)).id,
        "running": make_job(db, "sms", "sms.Send", status="started").id,
        "err": make_job(db, "sms", "sms.Send", status="err: RuntimeError: boom").id,
        "ok": make_job(db, "sms", "sms.Send", status="ok").id,
        "ok_detail": make_job(db, "mail", "mail.Bounce", status="ok: sent").id,
        "fail": make_job(db, "mail", "mail.Bounce", status="fail: no such mailbox").id,
        "skip": make_job(db, "mail", "mail.Bounce", status="skip: nothing to send").id,
    }


def test_the_jobs_list_filters_by_state_queue_name_and_time(db):
    ids = plant_states(db)
    old = make_job(db, "mail", "mail.Send", created_at=ago(days=3), status="ok").id
    newest_first = sorted([*ids.values(), old], reverse=True)
    with admin_site(db) as base:
        assert listed(base) == newest_first
        expect = {
            "pending": [ids["snoozed"], ids["retrying"], ids["scheduled"], ids["pending"]],
            "scheduled": [ids["snoozed"], ids["retrying"], ids["scheduled"]],
            "retrying": [ids["retrying"]],
            "running": [ids["running"]],
            "failed": [ids["err"]],
            "err": [ids["err"]],
            "done": [old, ids["skip"], ids["fail"], ids["ok_detail"], ids["ok"], ids["err"]],
            "ok": [old, ids["ok_detail"], ids["ok"]],
            "fail": [ids["fail"]],
            "skip": [ids["skip"]],
        }
        for state, want in expect.items():
            assert listed(base, state=state) == want, state
        assert listed(base, queue="sms") == [ids["ok"], ids["err"], ids["running"]]
        assert listed(base, name="mail.Bounce") == [ids["skip"], ids["fail"], ids["ok_detail"]]
        assert listed(base, queue="sms", state="ok") == [ids["ok"]]
        assert listed(base, since="1d") == newest_first[1:]
        assert listed(base, until="1d") == [old]
        assert listed(base, since="2000-01-01 00:00", until="2000-01-02T00:00Z") == []
        for bad in ({"state": "exploded"}, {"since": "yesterday"}, {"before": "x"}, {"queue": "a\x00b"}):
            answer = requests.get(f"{base}/admin/jobs", params=bad, headers=AUTH, timeout=5)
            assert answer.status_code == 400, bad
            assert 'id="jobs-error"' in answer.text and "<h1>Jobs</h1>" in answer.text


def test_the_jobs_list_pages_by_id_without_offset(db):
    made = [make_job(db, "mail", "mail.Send").id for _ in range(jobs.PAGE_SIZE * 2 + 7)]
    assert "OFFSET" not in Q.admin_job_list.upper()
    with admin_site(db) as base:
        seen: list[int] = []
        query = "?queue=mail"
        for _ in range(3):
            page = requests.get(f"{base}/admin/jobs{query}", headers=AUTH, timeout=10).text
            seen += [int(i) for i in re.findall(r'<tr data-id="(\d+)"', page)]
            older = re.search(r'href="/admin/jobs(\?[^"]+)" id="older"', page)
            if older is None:
                break
            query = html.unescape(older.group(1))
            assert "queue=mail" in query  # a page keeps the filters
        assert older is None
        assert seen == sorted(made, reverse=True)
        assert 'id="newest"' in page
        # A cursor is an id, so a row inserted meanwhile shifts no page.
        make_job(db, "mail", "mail.Send")
        assert listed(base, query)[0] == sorted(made, reverse=True)[2 * jobs.PAGE_SIZE]


def state_counts(page: str) -> dict[str, str]:
    return dict(re.findall(r'data-state="(\w+)"[^>]*>\w+ <span class="n">([^<]+)</span>', page))


def test_counts_per_state_follow_the_filters_and_stop_at_the_cap(db, monkeypatch):
    plant_states(db)
    # Counted, not estimated, however loaded the machine (the budget has tests of its own below).
    monkeypatch.setattr(jobs, "PAGE_BUDGET_MS", 5_000)
    with admin_site(db) as base:
        page = requests.get(f"{base}/admin/jobs", headers=AUTH, timeout=10).text
        assert state_counts(page) == {
            "all": "10",
            **{"pending": "4", "scheduled": "3", "retrying": "1", "running": "1", "failed": "1", "done": "5"},
            **{"ok": "2", "fail": "1", "skip": "1", "err": "1"},
        }
        assert "stop at 10,000 (shown as 10,000+)" in page
        page = requests.get(f"{base}/admin/jobs?queue=sms&state=ok", headers=AUTH, timeout=10).text
        counts = state_counts(page)
        assert (counts["all"], counts["ok"], counts["pending"], counts["running"]) == ("3", "1", "0", "1")
        monkeypatch.setattr(jobs, "COUNT_CAP", 2)
        page = requests.get(f"{base}/admin/jobs", headers=AUTH, timeout=10).text
        counts = state_counts(page)
        assert (counts["all"], counts["pending"], counts["ok"], counts["fail"]) == ("2+", "2+", "2", "1")
        assert "stop at 2 (shown as 2+)" in page


def test_a_slow_count_spends_the_pages_budget_and_the_rest_are_estimated(db, monkeypatch):
    make_job(db, "mail", "mail.Send")
    monkeypatch.setattr(Q, "admin_job_count", "SELECT count(*)::int FROM pg_sleep(0.3)")
    with admin_site(db) as base:
        page = requests.get(f"{base}/admin/jobs", headers=AUTH, timeout=10)
    # The first count is cut at the budget; no other one starts (ten would take 3 s).
    assert page.elapsed.total_seconds() < 1.5
    assert set(state_counts(page.text).values()) == {"≈ 1"}  # the plan's one row
    assert re.findall(r'<tr data-id="(\d+)"', page.text)  # the list is still shown


def test_counts_past_the_budget_are_the_planners_estimates_of_the_filter(db, monkeypatch):
    # Every fourth row sms, every fiftieth failed.
    for status, rows in (("ok", [i for i in range(1, 4001) if i % 50]), ("fail: bounced", range(50, 4001, 50))):
        queues = ["sms" if i % 4 == 0 else "mail" for i in rows]
        make_jobs(db, len(queues), queues, "mail.Send", status=status, max_attempts=1)
    db.exec("ANALYZE jobs")
    monkeypatch.setattr(jobs, "PAGE_BUDGET_MS", 0)
    with admin_site(db) as base:
        page = requests.get(f"{base}/admin/jobs?queue=mail", headers=AUTH, timeout=10).text
    counts = state_counts(page)
    assert all(c.startswith("≈ ") for c in counts.values()), counts

    def about(text: str) -> int:
        return int(text.removeprefix("≈ ").replace(",", ""))

    # 3,000 mail rows, 60 of them fail: estimates, so within a fifth.
    assert 2400 <= about(counts["all"]) <= 3600 and 2400 <= about(counts["ok"]) <= 3600
    assert 30 <= about(counts["fail"]) <= 90
    assert about(counts["pending"]) <= 5
    assert "≈ marks the database's estimate" in page


def test_search_by_id_name_prefix_and_args(db):
    first = make_job(db, "crm", "crm.SyncCustomer", {"customer_id": 42, "plan": {"tier": "gold"}}).id
    second = make_job(db, "crm", "crm.SyncCustomer", {"customer_id": 7, "plan": {"tier": "gold"}}).id
    third = make_job(db, "crm", "crm.Sync", {"customer_id": 42}).id
    other = make_job(db, "mail", "mail.Send", {"to": "a@example.com"}).id
    with admin_site(db) as base:
        for q in (str(second), f"#{second}", f" {second} "):
            answer = requests.get(f"{base}/admin/jobs", params={"q": q}, headers=AUTH, allow_redirects=False)
            assert (answer.status_code, answer.headers["Location"]) == (303, f"/admin/jobs/{second}"), q
        assert listed(base, q="crm.Sync") == [third, second, first]
        assert listed(base, q="crm.SyncC") == [second, first]
        assert listed(base, q="crm.%") == []  # a prefix, not a LIKE pattern
        assert listed(base, q='{"customer_id": 42}') == [third, first]
        assert listed(base, q='{"plan": {"tier": "gold"}}') == [second, first]
        assert listed(base, q='{"customer_id": 42}', name="crm.SyncCustomer") == [first]
        assert listed(base, q="{}") == [other, third, second, first]
        for q, said in (
            ('{"customer_id": 42', "not JSON (Expecting"),
            ('{"n": NaN}', "NaN is not JSON"),
            ("[1, 2]", None),  # not an object: a name prefix, which matches nothing
            ('{"a": "\\u0000"}', "jsonb holds no"),
            ("x" * 1001, "at most 1000 characters"),
        ):
            answer = requests.get(f"{base}/admin/jobs", params={"q": q}, headers=AUTH, timeout=5)
            if said is None:
                assert answer.status_code in (200, 400), q
                continue
            assert answer.status_code == 400, q
            assert said in html.unescape(re.search(r'id="jobs-error">([^<]*)<', answer.text).group(1)), q


def test_the_args_search_and_its_counts_read_the_gin_index(db):
    for n in range(50):
        make_job(db, "crm", "crm.SyncCustomer", {"customer_id": n}, status="ok")
    db.exec("ANALYZE jobs")
    values = jobs.params(jobs.Filters(q='{"customer_id": 42}'))
    for query in (Q.admin_job_list, Q.admin_job_count):
        with db.transaction() as tx:
            tx.exec("SET LOCAL enable_seqscan = off")
            plan = "\n".join(r[0] for r in tx.query("EXPLAIN " + query, {**values, "limit": 51, "cap": 10_000}))
        assert "jobs_args" in plan, plan
        # The other filters were folded away by the custom plan, not left as ORs.
        assert " OR " not in plan, plan


def test_a_window_of_a_day_reads_the_block_ranges_of_its_time_a_wider_one_newest_first(db):
    times = [ago(seconds=s) for s in range(10 * 86400, -1, -30)]  # oldest first, 30 seconds apart
    make_jobs(db, len(times), "mail", "mail.Send", status="ok", max_attempts=1, created_at=times, finished_at=times)
    db.exec("ANALYZE jobs")
    now = datetime.now(UTC)
    narrow = jobs.Filters(
        since=(now - timedelta(days=3)).isoformat(), until=(now - timedelta(days=3, hours=-1)).isoformat()
    )
    wide = jobs.Filters(since="9d", until="1h")

    def plan_of(filters: jobs.Filters) -> str:
        values = {**jobs.params(filters), "limit": 51}
        with db.transaction() as tx:
            tx.exec("SET LOCAL enable_seqscan = off")
            return "\n".join(r[0] for r in tx.query("EXPLAIN " + Q.admin_job_list, values))

    # Read through jobs_created and sorted: no index order the planner could
    # prefer (on 10M rows it would, and read the 3 days newer than the window).
    assert "jobs_created" in plan_of(narrow) and "(id + 0)" in plan_of(narrow), plan_of(narrow)
    assert "Index Scan Backward using jobs_pkey" in plan_of(wide)
    with admin_site(db) as base:
        shown = listed(base, "", since=narrow.since, until=narrow.until)
    expected = db.query(
        "SELECT id FROM jobs WHERE created_at >= %s AND created_at < %s ORDER BY id DESC LIMIT %s",
        (narrow.since, narrow.until, jobs.PAGE_SIZE),
    )
    assert shown == [r[0] for r in expected] and len(shown) == jobs.PAGE_SIZE


def test_a_job_page_shows_every_field_its_traceback_and_masks_secret_args(db, settings_of):
    settings_of({"JOBS_ADMIN_TOKEN": TOKEN, "GITHUB_TOKEN": "ghp_" + "s3cr3t" * 5})
    args = {
        "customer_id": 42,
        "api_token": "tok-visible-nowhere",
        "nested": [{"Password": "hunter2-nowhere"}, {"note": "ghp_" + "s3cr3t" * 5}],
    }
    job = make_job(
        db,
        "crm",
        "crm.Sync",
        args,
        status="err: KeyError: 'plan'",
        worker_id="vm-1:4242:ab12cd34",
        run_at=ago(seconds=5),
        started_at=ago(seconds=3),
        last_traceback="Traceback (most recent call last):\n  File \"queues/crm/__init__.py\", line 9\nKeyError: 'plan'\n",
        attempts=2,
        attempt_errors=json.dumps(
            [
                {
                    "attempt": 1,
                    "at": "t1",
                    "worker": "vm-0:1:aa",
                    "error": "err: TimeoutError: first try",
                    "traceback": 'Traceback (most recent call last):\n  File "queues/crm/first.py"\n',
                },
                {
                    "attempt": 2,
                    "at": "t2",
                    "worker": "vm-1:4242:ab12cd34",
                    "error": "err: KeyError: 'plan'",
                    "traceback": 'Traceback (most recent call last):\n  File "queues/crm/__init__.py", line 9\n',
                },
            ]
        ),
    )
    with admin_site(db) as base:
        page = requests.get(f"{base}/admin/jobs/{job.id}", headers=AUTH, timeout=5).text
    text = html.unescape(page)
    for shown in ("crm.Sync", "err: KeyError: 'plan'", "vm-1:4242:ab12cd34", job.callsite, '"customer_id": 42'):
        assert shown in text, shown
    assert "queues/crm/__init__.py" in re.search(r'<pre id="traceback">(.*?)</pre>', text, re.S).group(1)
    # Each attempt's error, the earlier one's traceback included.
    attempts = re.search(r'<ol id="attempt-errors"[^>]*>(.*?)</ol>', text, re.S).group(1)
    assert "attempt 1" in attempts and "err: TimeoutError: first try" in attempts and "queues/crm/first.py" in attempts
    assert "attempt 2" in attempts and "vm-0:1:aa" in attempts
    assert "tok-visible-nowhere" not in text and "hunter2-nowhere" not in text and "s3cr3t" not in text
    assert text.count("[redacted]") >= 3
    assert 'href="/admin/jobs?queue=crm"' in page and 'href="/admin/jobs?name=crm.Sync"' in page
    assert "/retry" in page and "/cancel" not in page and "/run-now" not in page
    assert re.search(r"<dt>latency</dt><dd[^>]*>\d+ ms", page) and "ran for" in page


def test_a_job_page_lists_its_steps_masked_and_retries_with_them_kept_or_forgotten(db, settings_of):
    settings_of({"JOBS_ADMIN_TOKEN": TOKEN, "GITHUB_TOKEN": "ghp_" + "s3cr3t" * 5})
    kept, fresh = failed_job(db), failed_job(db)
    summary = {"text": "three lines", "api_key": "sk-visible-nowhere", "echo": "ghp_" + "s3cr3t" * 5}
    for job_id in (kept, fresh):
        db.exec(
            "INSERT INTO job_steps (job_id, name, result) VALUES (%s, 'summary', %s), (%s, 'tokens', '[1200, 350]')",
            (job_id, json.dumps(summary), job_id),
        )
    # A secret where the preview is cut: masked whole all the same.
    cut_through = json.dumps("p" * 105 + "ghp_" + "s3cr3t" * 5)
    db.exec("INSERT INTO job_steps (job_id, name, result) VALUES (%s, 'long', %s)", (kept, cut_through))
    plain = failed_job(db)
    with admin_site(db) as base:
        page = requests.get(f"{base}/admin/jobs/{kept}", headers=AUTH, timeout=5).text
        text = html.unescape(page)
        steps = re.search(r'<table id="steps">(.*?)</table>', text, re.S).group(1)
        assert re.findall(r'<td class="name">([^<]*)</td>', steps) == ["summary", "tokens", "long"]
        assert '"text":"three lines"' in steps and "[1200,350]" in steps
        assert "sk-visible-nowhere" not in text and "s3c" not in text and steps.count("[redacted]") == 3
        assert f"/jobs/{kept}/retry-fresh" in page
        page = requests.get(f"{base}/admin/jobs/{plain}", headers=AUTH, timeout=5).text
        assert 'id="steps"' not in page and "/retry-fresh" not in page and f"/jobs/{plain}/retry" in page
        session = log_in(base)
        csrf = csrf_of(session, base)
        assert act(session, base, kept, "retry", csrf) == f"retried job {kept}: pending again, with one more attempt"
        message = act(session, base, fresh, "retry-fresh", csrf)
        assert message == f"retried job {fresh}: pending again, with one more attempt, its steps forgotten"
    assert db.query("SELECT DISTINCT job_id FROM job_steps") == [(kept,)]
    assert db.query("SELECT status FROM jobs WHERE id IN (%s, %s)", (kept, fresh)) == [("pending",)] * 2


def test_a_missing_job_is_a_404_page_in_the_layout(db):
    with admin_site(db) as base:
        for path in ("/admin/jobs/12345", "/admin/jobs/99999999999999999999", "/admin/jobs/x", "/admin/nope"):
            answer = requests.get(f"{base}{path}", headers=AUTH, timeout=5)
            assert answer.status_code == 404, path
            assert answer.headers["Content-Type"] == "text/html; charset=utf-8"
            assert "<h1>Not found</h1>" in answer.text and 'href="/admin/jobs"' in answer.text, path
        assert "There is no job 12345" in requests.get(f"{base}/admin/jobs/12345", headers=AUTH).text


def act(session: requests.Session, base: str, job_id: int, action: str, csrf: str) -> str:
    answer = session.post(f"{base}/admin/jobs/{job_id}/{action}", data={"csrf": csrf}, allow_redirects=False)
    assert (answer.status_code, answer.headers["Location"]) == (303, f"/admin/jobs/{job_id}")
    return html.unescape(
        re.search(
            r'class="flash" role="status">([^<]*)<', session.get(f"{base}{answer.headers['Location']}").text
        ).group(1)
    )


def test_cancel_run_now_and_retry_each_only_in_its_state(db, caplog):
    caplog.set_level(logging.INFO, logger="jobs.admin")
    due = make_job(db, "mail", "mail.Send").id
    scheduled = make_job(db, "mail", "mail.Send", run_at=later(hours=2)).id
    running = make_job(db, "mail", "mail.Send", status="started").id
    failed = failed_job(db)
    done = make_job(db, "mail", "mail.Send", status="ok").id

    def status_of(job_id: int) -> str:
        return db.query_row("SELECT status FROM jobs WHERE id = %s", (job_id,))[0]

    with admin_site(db) as base:
        session = log_in(base)
        csrf = csrf_of(session, base)
        # Refused in a wrong state, and the row left as it was.
        assert "not made due: it is running" in act(session, base, running, "run-now", csrf)
        assert "not cancelled: it has already ended: ok" in act(session, base, done, "cancel", csrf)
        assert "already due" in act(session, base, due, "run-now", csrf)
        assert "not made due: it is no longer pending: err:" in act(session, base, failed, "run-now", csrf)
        assert "not retried: only a failed (err:) job is; it is pending" in act(session, base, due, "retry", csrf)
        assert "not retried: only a failed (err:) job is; it is ok" in act(session, base, done, "retry", csrf)
        assert "not cancelled: there is no such job" in act(session, base, 999999, "cancel", csrf)
        assert [status_of(i) for i in (running, done, failed)] == ["started", "ok", "err: RuntimeError: smtp down"]

        message = act(session, base, scheduled, "run-now", csrf)
        assert message == f"job {scheduled} is due now"
        assert db.query_row("SELECT run_at <= now() FROM jobs WHERE id = %s", (scheduled,)) == (True,)
        assert f"cancelled job {due}: skip: cancelled by an operator" in act(session, base, due, "cancel", csrf)
        assert re.fullmatch(r"skip: cancelled by an operator on the admin page \(session [0-9a-f]{8}\)", status_of(due))
        assert "retried job" in act(session, base, failed, "retry", csrf)
        assert status_of(failed) == "pending"
        # What fits each state is what the page offers.
        page = session.get(f"{base}/admin/jobs/{make_job(db, 'mail', run_at=later(hours=1)).id}").text
        assert "/run-now" in page and "/cancel" in page and "/retry" not in page
        page = session.get(f"{base}/admin/jobs/{running}").text
        assert "/cancel" in page and "/run-now" not in page and "/retry" not in page
        page = session.get(f"{base}/admin/jobs/{done}").text
        assert 'id="actions"' not in page
    logged = [r.getMessage() for r in caplog.records if r.name == "jobs.admin"]
    assert any(f"admin cancel job={due} by session " in line for line in logged)
    assert any(f"admin run-now job={scheduled} by session " in line for line in logged)
    assert any(f"admin retry job={failed} by session " in line for line in logged)


def test_cancel_of_a_running_job_stops_its_handler_and_ends_it_cancelled(db, database_url, caplog):
    caplog.set_level(logging.INFO, logger="jobs.admin")
    began = Event()
    poller = make_poller("mail", db, {"mail.Send": lambda job: began.set() or gevent.sleep(60) or "ok"})
    job_id = insert(db, "mail", "mail.Send")
    with admin_site(db) as base, listening(database_url, poller.leases):
        session = log_in(base)
        csrf = csrf_of(session, base)
        working = gevent.spawn(poller.work_once)
        assert began.wait(10)
        said = act(session, base, job_id, "cancel", csrf)
        assert re.fullmatch(
            rf"stopping job {job_id}: its worker ends it skip: cancelled by an operator on the admin page"
            r" \(session [0-9a-f]{8}\)",
            said,
        ), said
        status = working.get(timeout=5)
        assert re.fullmatch(r"skip: cancelled by an operator on the admin page \(session [0-9a-f]{8}\)", status)
        assert db.query_row("SELECT status, attempts FROM jobs WHERE id = %s", (job_id,)) == (status, 1)
        # Ended now: a second cancel changes nothing, and says so.
        assert (
            act(session, base, job_id, "cancel", csrf)
            == f"job {job_id} was not cancelled: it has already ended: {status}"
        )
    logged = [r.getMessage() for r in caplog.records if r.name == "jobs.admin"]
    assert any(f"admin cancel job={job_id} by session " in line and "stopping" in line for line in logged)


def test_a_running_job_asked_to_stop_says_so_and_offers_no_second_cancel(db):
    running = make_job(db, "mail", "mail.Send", status="started").id
    with admin_site(db) as base:
        session = log_in(base)
        assert act(session, base, running, "cancel", csrf_of(session, base)).startswith(f"stopping job {running}")
        page = html.unescape(session.get(f"{base}/admin/jobs/{running}").text)
    assert re.search(r'id="cancel-requested">stopping: cancelled by an operator on the admin page \(session', page)
    assert 'id="actions"' not in page


def test_every_new_form_needs_the_csrf_token_and_every_new_page_a_token(db):
    pending = make_job(db, "mail", "mail.Send", run_at=later(hours=1)).id
    failed = failed_job(db)
    with admin_site(db) as base:
        for path in ("/admin/jobs", f"/admin/jobs/{pending}", "/admin/jobs?q=%7B%7D", "/admin/jobs?q=mail"):
            answer = requests.get(f"{base}{path}", allow_redirects=False, timeout=5)
            assert (answer.status_code, answer.headers["Location"]) == (303, "/admin/login"), path
            answer = requests.get(f"{base}{path}", headers={"Authorization": "Bearer nope"}, timeout=5)
            assert answer.status_code == 401, path
        session = log_in(base)
        other = log_in(base)
        posts = [(pending, "cancel"), (pending, "run-now"), (failed, "retry")]
        for job_id, action in posts:
            url = f"{base}/admin/jobs/{job_id}/{action}"
            assert requests.post(url, timeout=5).status_code == 401
            for data in ({}, {"csrf": ""}, {"csrf": "0" * 64}, {"csrf": csrf_of(other, base)}):
                answer = session.post(url, data=data, allow_redirects=False)
                assert answer.status_code == 403 and "CSRF" in answer.text, (action, data)
            assert session.get(url).status_code == 404  # an action is never a GET
        assert db.query("SELECT status, run_at > now() FROM jobs ORDER BY id") == [
            ("pending", True),
            ("err: RuntimeError: smtp down", False),
        ]
        # A script's bearer token needs no CSRF token.
        answer = requests.post(f"{base}/admin/jobs/{pending}/cancel", headers=AUTH, allow_redirects=False, timeout=5)
        assert answer.status_code == 303
    assert db.query_row("SELECT status FROM jobs WHERE id = %s", (pending,))[0].startswith("skip: cancelled")


def test_hostile_names_args_errors_and_searches_are_escaped(db):
    job = make_job(
        db,
        XSS,
        XSS,
        {XSS: XSS},
        status=f"err: ValueError: {XSS}",
        callsite=XSS,
        worker_id=XSS,
        last_traceback=f"Traceback\n{XSS}\n",
        attempt_errors=json.dumps(
            [{"attempt": n, "at": XSS, "worker": XSS, "error": XSS, "traceback": XSS} for n in (1, 2)]
        ),
    ).id
    with admin_site(db) as base:
        pages = [
            requests.get(f"{base}/admin/jobs", headers=AUTH, timeout=5).text,
            requests.get(f"{base}/admin/jobs/{job}", headers=AUTH, timeout=5).text,
            requests.get(f"{base}/admin/jobs", params={"q": XSS, "queue": XSS, "name": XSS}, headers=AUTH).text,
            requests.get(f"{base}/admin/jobs", params={"q": "{" + XSS}, headers=AUTH).text,
            requests.get(f"{base}/admin/jobs", params={"q": json.dumps({XSS: XSS})}, headers=AUTH).text,
            requests.get(f"{base}/admin/jobs", params={"since": XSS, "state": XSS}, headers=AUTH).text,
        ]
    for page in pages:
        assert "<img" not in page
        assert "&lt;img src=x onerror=alert(1)&gt;" in page
    assert f'<tr data-id="{job}"' in pages[2] and f'<tr data-id="{job}"' in pages[4]


# -- the queues, one queue, the charts, the schedule, the workers, the live numbers, bulk actions


@contextmanager
def whole_site(db, **options):
    """The site as a worker builds it: its own queues, the registry with the off ones, a schedule."""
    admin = Admin(
        db,
        TOKEN,
        queue_stats=overview.queue_stats,
        workers=overview.workers,
        queues=["mail"],
        registered={"mail": None, "sms": None, "github": "GITHUB_TOKEN is not set"},
        **options,
    )
    with serving(make_app(Health(db), metrics.registry(), admin=admin)) as base:
        yield base


def get(base: str, path: str, **params: str) -> str:
    answer = requests.get(f"{base}{path}", params=params, headers=AUTH, timeout=10)
    assert answer.status_code == 200, (path, answer.status_code, answer.text[:500])
    return answer.text


def queue_row(page: str, queue: str) -> str:
    found = re.search(rf'<tr data-queue="{re.escape(html.escape(queue))}" data-run="(\w+)">(.*?)</tr>', page, re.S)
    assert found, queue
    return found.group(1) + " " + found.group(2)


def test_the_queues_page_lists_run_off_idle_and_unrun_queues(db):
    worker_registry.register(db, "vm-1:1:aa", ["mail"], 30.0, [("mail", ["mail.Send"])])
    make_job(db, "mial", "mail.Send")  # a typo in an enqueue: rows no worker will take
    with whole_site(db) as base:
        page = get(base, "/admin/")
        assert queue_row(page, "mail").startswith("running") and "run by 1 worker" in queue_row(page, "mail")
        github = queue_row(page, "github")
        assert github.startswith("off") and "GITHUB_TOKEN is not set" in github
        assert queue_row(page, "sms").startswith("idle") and "no live worker" in queue_row(page, "sms")
        unrun = queue_row(page, "mial")
        assert unrun.startswith("unrun") and "no worker" in unrun
        # Pause is offered where a worker runs the queue or would: not for one that is off or unrun.
        assert 'action="/admin/pause"' in queue_row(page, "mail") and 'action="/admin/pause"' in queue_row(page, "sms")
        assert 'action="/admin/pause"' not in github and 'action="/admin/pause"' not in unrun
        assert 'href="/admin/jobs?queue=mial"' in unrun
        session = log_in(base)
        csrf = csrf_of(session, base)
        for queue in ("mial", "github"):
            said = session.post(f"{base}/admin/pause", data={"queue": queue, "reason": "x", "csrf": csrf}).text
            assert f"not paused: no live worker runs {queue}" in said
        assert not db.query("SELECT * FROM job_queues")


# A moment as the page writes it: the time of day, or with its date when that
# is not today (a pause that ends past midnight UTC).
CLOCK = r"(?:\d\d:\d\d:\d\dZ|\d{4}-\d\d-\d\d \d\d:\d\dZ)"


def test_the_state_says_who_paused_until_when_throttled_until_when_and_rate_limited(db):
    db.exec(
        "INSERT INTO job_queues (queue, paused_until, pause_reason, next_claim_at) VALUES"
        " ('mail', now() + interval '25 minutes', 'deploy (session 0123abcd, admin page)', NULL),"
        " ('sms', NULL, NULL, now() + interval '0.4 seconds'),"
        " ('github', NULL, NULL, now() + interval '90 seconds')"
    )
    make_job(db, "github", "github.Sync", attempts=0, last_error="skip: rate limited, resets in 90s: 429 from GitHub")
    with whole_site(db) as base:
        page = html.unescape(get(base, "/admin/"))
    mail = queue_row(page, "mail")
    assert re.search(rf"paused until {CLOCK} \(for 2[45]m\d\ds\)", mail), mail
    assert "deploy (session 0123abcd, admin page)" in mail
    sms = queue_row(page, "sms")
    assert re.search(rf"throttled until {CLOCK} \(for 0\.\ds\)", sms), sms
    assert "for 0s" not in page
    github = queue_row(page, "github")
    assert re.search(rf"rate limited until {CLOCK} \(for 1m\d\ds\)", github), github
    assert "resets in 90s: 429 from GitHub" in github


def plant_minutes(db, queue: str, minutes: int, *, ok: int = 2, err: int = 0, backlog: int = 5) -> None:
    """Rows of the rollup for the minutes before this one, for the queue and for every queue ('')."""
    for q in (queue, ""):
        db.exec(
            "INSERT INTO job_minutes (queue, minute, ok, err, latency_p50, latency_p95, backlog)"
            " SELECT %s, date_trunc('minute', now()) - n * interval '1 minute', %s, %s, 0.2, 1.5, %s"
            " FROM generate_series(1, %s) AS n",
            (q, ok, err, backlog, minutes),
        )


def test_the_rate_and_the_charts_read_the_rollup(db):
    plant_minutes(db, "mail", 30, ok=2, err=1)
    with whole_site(db) as base:
        page = get(base, "/admin/")
        # 3 finished a minute in each of the last 15 minutes rolled up.
        assert re.search(r'class="n rate"[^>]*>3/min<', queue_row(page, "mail"))
        assert re.search(r'class="n rate"[^>]*>-<', queue_row(page, "sms")) is None  # rolled up: 0, not unknown
        assert re.search(r'class="n rate"[^>]*>0/min<', queue_row(page, "sms"))
        charts = re.search(r'<section class="charts" id="charts" data-window="hour">(.*?)</section>', page, re.S)
        assert charts.group(1).count("<svg") == 3
        assert charts.group(1).count('fill="#2e7d32"') == 30  # a bar of ok jobs for each planted minute
        assert "Finished per minute: 60 ok, 0 fail, 0 skip, 30 err" in page
        assert "<polyline" in charts.group(1)
        day = get(base, "/admin/", window="day")
        assert 'data-window="day"' in day and "Finished per 10 minutes" in day
        one = get(base, "/admin/queue", queue="mail")
        assert 'id="charts-hour"' in one and 'id="charts-day"' in one
        assert one.count("<svg") == 6 and 'href="/admin/jobs?queue=mail"' in one
        empty = get(base, "/admin/queue", queue="sms")
        assert "No minute of this window is rolled up yet" in empty
        missing = requests.get(f"{base}/admin/queue", params={"queue": "nope"}, headers=AUTH, timeout=5)
        assert missing.status_code == 404 and "No queue &#39;nope&#39;" in missing.text


def test_the_schedule_page_shows_cadence_next_runs_and_last_fired(db):
    entries = [
        Scheduled("mail", "mail.Digest", every(15), args={"to": "team"}),
        Scheduled("mail", "mail.Report", cron("0 9 * * 1-5", tz="Europe/Paris"), catch_up=True),
        Scheduled("sms", "sms.Nightly", weekdays(daily(3, 17))),
    ]
    db.exec(
        "INSERT INTO clock_ticks (name, entry, minute) VALUES (%s, %s, date_trunc('minute', now()) - interval '3 minutes')",
        (entries[0].name, entries[0].key),
    )
    with whole_site(db, schedule=entries) as base:
        page = html.unescape(get(base, "/admin/schedule"))
    rows = dict(re.findall(r'<tr data-name="([^"]+)">(.*?)</tr>', page, re.S))
    assert "every(15)" in rows["mail.Digest"] and '{"to": "team"}' in rows["mail.Digest"]
    assert "cron('0 9 * * 1-5', tz='Europe/Paris')" in rows["mail.Report"] and "catches up" in rows["mail.Report"]
    assert "weekdays(daily(3, 17))" in rows["sms.Nightly"]
    assert len(re.findall(r"<li title=", rows["mail.Digest"])) == 3
    assert len(re.findall(r"<li title=", rows["mail.Report"])) == 3  # cron's runs: days ahead, from cronsim
    assert re.search(r'data-live="entry:0:fired">3m\d\ds ago<', rows["mail.Digest"])
    assert "not in the last 3 days" in rows["mail.Report"]


def test_the_workers_page_shows_each_workers_queues_and_handled_names(db):
    worker_registry.register(db, "vm-1:4242:ab12cd34", ["mail", "sms"], 30.0, [("mail", ["mail.Send", "mail.Bounce"])])
    with whole_site(db) as base:
        page = get(base, "/admin/workers")
    row = re.search(r'<tr data-worker="vm-1:4242:ab12cd34">(.*?)</tr>', page, re.S).group(1)
    assert "4242" in row and "alive" in row
    assert "mail.Bounce, mail.Send" in row and 'href="/admin/queue?queue=sms"' in row


def test_live_numbers_follow_the_rows_and_need_a_login(db):
    worker_registry.register(db, "vm-1:1:aa", ["mail"], 30.0)
    with whole_site(db, schedule=[Scheduled("mail", "mail.Digest", every(15))]) as base:
        answer = requests.get(f"{base}/admin/live", params={"page": "queues"}, headers=AUTH, timeout=5)
        assert answer.headers["Content-Type"] == "application/json"
        numbers = answer.json()["numbers"]
        assert numbers["queue:mail:pending"] == "0" and numbers["queue:github:pending"] == "0"
        make_job(db, "mail", "mail.Send")
        again = requests.get(f"{base}/admin/live", params={"page": "queues"}, headers=AUTH, timeout=5).json()
        assert again["numbers"]["queue:mail:pending"] == "1"
        # Each number the page shows has the key its refresh writes.
        page = get(base, "/admin/")
        assert set(re.findall(r'data-live="([^"]+)"', page)) <= set(numbers)
        one = requests.get(f"{base}/admin/live?page=queue&queue=mail", headers=AUTH, timeout=5).json()["numbers"]
        assert "queue:mail:pending" in one and "queue:github:pending" not in one
        workers = requests.get(f"{base}/admin/live?page=workers", headers=AUTH, timeout=5).json()["numbers"]
        assert workers["worker:vm-1:1:aa:holding"] == "0"
        schedule = requests.get(f"{base}/admin/live?page=schedule", headers=AUTH, timeout=5).json()["numbers"]
        assert schedule["entry:0:fired"] == "not in the last 3 days"
        assert requests.get(f"{base}/admin/live?page=jobs", headers=AUTH, timeout=5).status_code == 404
        # No session: a 401, never the login page's HTML in place of numbers.
        assert requests.get(f"{base}/admin/live?page=queues", allow_redirects=False, timeout=5).status_code == 401
        session = log_in(base)
        assert session.get(f"{base}/admin/live?page=queues").json()["numbers"]["queue:mail:pending"] == "1"


def test_the_page_script_may_fetch_only_this_site(db):
    with whole_site(db) as base:
        answer = requests.get(f"{base}/admin/", headers=AUTH, timeout=5)
    csp = answer.headers["Content-Security-Policy"]
    assert "connect-src 'self'" in csp and "default-src 'none'" in csp
    nonce = re.search(r"script-src 'nonce-([^']+)'", csp).group(1)
    assert answer.text.count("<script") == answer.text.count(f'<script nonce="{nonce}">') == 1
    assert "location.reload" not in answer.text and "visibilityState" in answer.text


def bulk_preview(base: str, session: requests.Session, action: str, **filters: str) -> tuple[int | None, str]:
    page = session.get(f"{base}/admin/jobs/bulk", params={"action": action, **filters}).text
    found = re.search(r'id="bulk-count" data-count="(\d+)"', page)
    return (int(found.group(1)) if found else None), page


def test_bulk_retry_and_cancel_preview_then_act_in_one_statement(db, caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="jobs.admin")
    failed = [failed_job(db, name="mail.Send") for _ in range(3)]
    other = failed_job(db, queue="sms", name="sms.Send")
    pending = [make_job(db, "mail", "mail.Send", run_at=later(hours=1)).id for _ in range(2)]
    due = make_job(db, "mail", "mail.Bounce").id
    with whole_site(db) as base:
        session = log_in(base)
        listing = session.get(f"{base}/admin/jobs", params={"queue": "mail"}).text
        assert 'id="bulk-retry"' in listing and 'id="bulk-cancel"' in listing
        count, page = bulk_preview(base, session, "retry", queue="mail")
        assert count == 3 and "Retry 3 jobs" in page
        assert bulk_preview(base, session, "retry", queue="mail", state="pending")[0] == 0
        assert bulk_preview(base, session, "cancel", queue="mail", state="scheduled")[0] == 2
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page).group(1)
        answer = session.post(
            f"{base}/admin/jobs/bulk", data={"csrf": csrf, "action": "retry", "queue": "mail"}, allow_redirects=False
        )
        assert answer.headers["Location"] == "/admin/jobs?queue=mail"
        assert "retried 3 jobs" in session.get(f"{base}/admin/jobs?queue=mail").text
        statuses = dict(db.query("SELECT id, status FROM jobs"))
        assert [statuses[i] for i in failed] == ["pending"] * 3 and statuses[other].startswith("err: ")
        # Past the cap nothing is done: the statement is rolled back.
        monkeypatch.setattr(lib.http.admin.bulk, "BULK_CAP", 1)
        said = session.post(
            f"{base}/admin/jobs/bulk", data={"csrf": csrf, "action": "cancel", "queue": "mail", "state": "scheduled"}
        ).text
        assert "nothing done: over 1 jobs match" in said
        assert all(
            s == "pending" for s in dict(db.query("SELECT id, status FROM jobs")).values() if s != statuses[other]
        )
        monkeypatch.undo()
        said = session.post(
            f"{base}/admin/jobs/bulk", data={"csrf": csrf, "action": "cancel", "queue": "mail", "state": "scheduled"}
        ).text
        assert "cancelled 2 jobs: skip: cancelled by an operator on the admin page (session " in html.unescape(said)
    statuses = dict(db.query("SELECT id, status FROM jobs"))
    assert all(statuses[i].startswith("skip: cancelled") for i in pending) and statuses[due] == "pending"
    logged = [r.getMessage() for r in caplog.records if r.name == "jobs.admin"]
    assert any(
        re.search(r"admin bulk retry by session [0-9a-f]{8}, filters \?queue=mail: retried 3", m) for m in logged
    )
    assert any("admin bulk cancel by session " in m and "cancelled 2 jobs" in m for m in logged)


def test_a_bulk_preview_past_the_pages_budget_shows_the_estimate_and_the_action_counts_again(db, monkeypatch):
    """A count cut by the page's budget (here 1 ms, against 20,000 rows read
    through the heap for their name) gives way to the planner's estimate;
    the action reads the ids itself, as ever."""
    make_jobs(db, 20000, "mail", "mail.Send", run_at=later(hours=1))
    db.exec("ANALYZE jobs")
    monkeypatch.setattr(jobs, "PAGE_BUDGET_MS", 1)
    with whole_site(db) as base:
        session = log_in(base)
        count, page = bulk_preview(base, session, "cancel", name="mail.Send")
        page = html.unescape(page)
        assert 'action="/admin/jobs/bulk"' not in page
        assert 10_000 < count < 40_000 and "jobs match, by the planner's estimate: narrow the filters" in page
        monkeypatch.setattr(lib.http.admin.bulk, "BULK_CAP", 50_000)
        count, page = bulk_preview(base, session, "cancel", name="mail.Send")
        page = html.unescape(page)
        assert 'id="bulk-estimated"' in page
        assert f"Cancel ≈ {round(count, 3 - len(str(count))):,} jobs</button>" in page, page
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page).group(1)
        said = session.post(
            f"{base}/admin/jobs/bulk", data={"csrf": csrf, "action": "cancel", "name": "mail.Send"}
        ).text
        assert "cancelled 20000 jobs" in said
    assert db.query_row("SELECT count(*) FROM jobs WHERE status = 'pending'")[0] == 0


def test_the_queues_page_counts_a_backlog_up_to_its_share_of_the_rows(db, monkeypatch):
    """Past its share of PENDING_ROWS a queue's pending rows show as "N+", its
    due rows exactly while a scheduled row was read, the rest as at least."""
    make_jobs(db, 60, "mail", "mail.Send", run_at=ago(minutes=1))
    make_jobs(db, 440, "mail", "mail.Send", run_at=later(hours=1))
    make_jobs(db, 150, "sms", "sms.Send")
    make_job(db, "sms", "sms.Send", run_at=later(hours=1))
    monkeypatch.setattr(lib.http.admin.queues, "PENDING_ROWS", 100)  # two queues: 100 each, the least share
    with whole_site(db) as base:
        row = queue_row(get(base, "/admin/"), "mail")
        live = json.loads(get(base, "/admin/live", page="queues"))["numbers"]
    cells = dict(re.findall(r'data-label="(pending|due|delayed|retrying)"[^>]*>([^<]*)<', row))
    assert cells == {"pending": "100+", "due": "60", "delayed": "41+", "retrying": "0+"}, row
    # sms: every row read was due, so its due rows are past the share too.
    assert (live["queue:mail:pending"], live["queue:mail:due"]) == ("100+", "60")
    assert (live["queue:sms:pending"], live["queue:sms:due"], live["queue:sms:delayed"]) == ("100+", "100+", "0+")


def test_bulk_retry_skips_deduped_copies_as_redrive_does(db):
    db.exec("INSERT INTO job_dedupe_names (queue, name) VALUES ('mail', 'mail.Send')")
    older = failed_job(db, name="mail.Send")
    newer = failed_job(db, name="mail.Send")
    with whole_site(db) as base:
        answer = requests.post(
            f"{base}/admin/jobs/bulk", data={"action": "retry", "name": "mail.Send"}, headers=AUTH, timeout=10
        )
        assert "retried 1 jobs; skipped 1" in html.unescape(answer.text)
    assert db.query("SELECT id, status = 'pending' FROM jobs ORDER BY id") == [(older, False), (newer, True)]


def test_every_new_page_and_form_needs_a_token_and_the_csrf_token(db):
    failed_job(db)
    with whole_site(db) as base:
        for path in (
            "/admin/queue?queue=mail",
            "/admin/schedule",
            "/admin/jobs/bulk?action=retry",
            "/admin/?window=day",
        ):
            answer = requests.get(f"{base}{path}", allow_redirects=False, timeout=5)
            assert (answer.status_code, answer.headers["Location"]) == (303, "/admin/login"), path
            assert requests.get(f"{base}{path}", headers={"Authorization": "Bearer no"}, timeout=5).status_code == 401
        assert requests.get(f"{base}/admin/live?page=queues", headers={"Authorization": "Bearer no"}).status_code == 401
        session, other = log_in(base), log_in(base)
        for url, data in (
            (f"{base}/admin/jobs/bulk", {"action": "retry", "queue": "mail"}),
            (f"{base}/admin/jobs/bulk", {"action": "cancel"}),
            (f"{base}/admin/resume", {"queue": "mail"}),
        ):
            assert requests.post(url, data=data, timeout=5).status_code == 401
            for token in ({}, {"csrf": ""}, {"csrf": csrf_of(other, base)}):
                answer = session.post(url, data={**data, **token}, allow_redirects=False)
                assert answer.status_code == 403 and "CSRF" in answer.text, (url, token)
    assert db.query_row("SELECT status FROM jobs")[0].startswith("err: ")


def test_hostile_queue_names_reasons_entries_and_hosts_are_escaped(db):
    db.exec(
        "INSERT INTO workers (id, host, pid, queues, started_at, last_seen, lease_seconds, handles)"
        " VALUES (%s, %s, 1, %s, now(), now(), 30, %s::jsonb)",
        (XSS, XSS, [XSS], json.dumps({XSS: [XSS]})),
    )
    make_job(db, XSS, XSS, status=f"err: {XSS}")
    db.exec("INSERT INTO job_queues (queue, paused_until, pause_reason) VALUES (%s, 'infinity', %s)", (XSS, XSS))
    plant_minutes(db, XSS, 3)
    admin = Admin(
        db,
        TOKEN,
        queue_stats=overview.queue_stats,
        workers=overview.workers,
        registered={XSS: XSS, "mail": f"off: {XSS}"},
        schedule=[Scheduled("mail", "mail.X", every(5), args={XSS: XSS})],
    )
    with serving(make_app(Health(db), metrics.registry(), admin=admin)) as base:
        pages = [
            get(base, "/admin/"),
            get(base, "/admin/queue", queue=XSS),
            get(base, "/admin/schedule"),
            get(base, "/admin/workers"),
            get(base, "/admin/jobs/bulk", action="retry", queue=XSS, q=XSS, name=XSS),
            requests.get(f"{base}/admin/queue", params={"queue": XSS + "x"}, headers=AUTH, timeout=5).text,
        ]
        refused = requests.get(f"{base}/admin/jobs/bulk", params={"action": "cancel", "q": "{" + XSS}, headers=AUTH)
        assert refused.status_code == 400 and "args search: not JSON" in refused.text and "<img" not in refused.text
        live = requests.get(f"{base}/admin/live", params={"page": "queues"}, headers=AUTH, timeout=5).text
    for page in pages:
        assert "<img" not in page
        assert "&lt;img src=x onerror=alert(1)&gt;" in page
    # JSON, which the page writes as text (textContent), never as HTML.
    assert json.loads(live)["numbers"][f"queue:{XSS}:pending"] == "0"


def test_the_queue_page_scales_a_queue_within_its_definition(db):
    """The queue page's form sets the concurrency for every worker, from 1 to
    the definition's; a queue this worker does not run, a value out of range
    and a POST without the session's CSRF token change nothing."""
    with whole_site(db, concurrency={"mail": 4}) as base:
        session = log_in(base)
        page = session.get(f"{base}/admin/queue", params={"queue": "mail"}).text
        assert (
            'id="scale-form"' in page
            and "4 at a time in every worker, its definition's; at most 4." in html.unescape(page)
        )
        csrf = csrf_of(session, base)
        refused = session.post(f"{base}/admin/scale", data={"queue": "mail", "concurrency": "2"})
        assert refused.status_code == 403
        for form, said in (
            ({"queue": "mail", "concurrency": "5"}, "runs from 1 to 4 jobs at once"),
            ({"queue": "mail", "concurrency": "0"}, "runs from 1 to 4 jobs at once"),
            ({"queue": "mail", "concurrency": "x"}, "runs from 1 to 4 jobs at once"),
            ({"queue": "sms", "concurrency": "1"}, "does not run 'sms'"),
        ):
            page = session.post(f"{base}/admin/scale", data={**form, "csrf": csrf}).text
            assert said in html.unescape(page), form
        assert not db.query("SELECT * FROM job_queues WHERE scaled_to IS NOT NULL")
        page = session.post(f"{base}/admin/scale", data={"queue": "mail", "concurrency": "2", "csrf": csrf}).text
        assert "mail runs 2 at a time" in page
        to, by = db.query_row("SELECT scaled_to, scaled_by FROM job_queues WHERE queue = 'mail'")
        assert to == 2 and re.fullmatch(r"admin session [0-9a-f]{8}", by)
        assert "2 at a time in every worker, set by admin session" in html.unescape(page)
        session.post(f"{base}/admin/scale", data={"queue": "mail", "concurrency": "default", "csrf": csrf})
        assert db.query_row("SELECT scaled_to FROM job_queues WHERE queue = 'mail'") == (None,)


def test_an_action_on_a_row_another_transaction_holds_says_so_and_does_nothing(db, database_url, monkeypatch, caplog):
    """A lock left open in psql costs an action ACTION_LOCK_TIMEOUT_MS, not
    a request that hangs: the operator reads why, and may try again."""
    caplog.set_level(logging.WARNING, logger="jobs.admin")
    monkeypatch.setattr(lib.http.admin, "ACTION_LOCK_TIMEOUT_MS", 300)
    held = make_job(db, "mail", "mail.Send", run_at=later(hours=1)).id
    free = make_job(db, "mail", "mail.Send", run_at=later(hours=1)).id
    failed = failed_job(db)
    db.exec("INSERT INTO job_queues (queue) VALUES ('mail')")
    holder = psycopg2.connect(database_url)
    try:
        with holder.cursor() as cur:
            cur.execute("SELECT 1 FROM jobs WHERE id = ANY(%s) FOR UPDATE", ([held, failed],))
            cur.execute("SELECT 1 FROM job_queues WHERE queue = 'mail' FOR UPDATE")
        with admin_site(db) as base:
            session = log_in(base)
            csrf = csrf_of(session, base)
            locked = "nothing done: a row it changes was held by another transaction for over 0.3s; try again"
            for action, job_id in (("cancel", held), ("run-now", held), ("retry", failed)):
                assert act(session, base, job_id, action, csrf) == locked, action
            answer = session.post(
                f"{base}/admin/jobs/bulk",
                data={"csrf": csrf, "action": "cancel", "queue": "mail", "state": "scheduled"},
                allow_redirects=False,
            )
            assert answer.headers["Location"] == "/admin/jobs"
            assert locked in html.unescape(session.get(f"{base}/admin/jobs").text)
            page = session.post(f"{base}/admin/pause", data={"queue": "mail", "csrf": csrf, "reason": "deploy"}).text
            assert locked in html.unescape(page)
            # The bulk cancel is one statement: the free row is not cancelled alone.
            statuses = dict(db.query("SELECT id, status FROM jobs"))
            assert (statuses[held], statuses[free], statuses[failed][:4]) == ("pending", "pending", "err:")
            assert db.query_row("SELECT paused_until FROM job_queues WHERE queue = 'mail'") == (None,)
            holder.rollback()
            assert act(session, base, held, "cancel", csrf).startswith(f"cancelled job {held}")
    finally:
        holder.close()
    warned = [r.getMessage() for r in caplog.records if "locked; nothing done" in r.getMessage()]
    assert len(warned) == 5


def test_a_job_page_shows_what_it_waits_for_and_what_waits_for_it(db):
    dep = insert(db, "mail", "mail.Send")
    waiting = insert(db, "mail", "mail.Send", {"n": 2}, after=[dep])
    with admin_site(db) as base:
        page = html.unescape(requests.get(f"{base}/admin/jobs/{waiting}", headers=AUTH, timeout=5).text)
        waits = re.search(r'<dl id="waits">(.*?)</dl>', page, re.S).group(1)
        assert "waits for" in waits and f'/admin/jobs/{dep}">{dep}</a>' in waits and "waited for by" not in waits
        # Not offered to run now: it is not due until its job ends.
        assert f"/jobs/{waiting}/run-now" not in page
        page = html.unescape(requests.get(f"{base}/admin/jobs/{dep}", headers=AUTH, timeout=5).text)
        waits = re.search(r'<dl id="waits">(.*?)</dl>', page, re.S).group(1)
        assert "waited for by" in waits and f'/admin/jobs/{waiting}">{waiting}</a>' in waits
