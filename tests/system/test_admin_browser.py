"""The admin page in a real headless browser (Debian's chromium, driven by
Playwright): no token, no page; log in, see the queues, retry a failure and
see it pending, pause and resume; browse, filter and search the jobs, read a
job's traceback, cancel, run now and retry it; HTML in a job's name shown as
text, and a POST without the CSRF token refused; the queues page with an off
queue and one no worker runs, a queue's charts after jobs ran, the schedule,
workers and database pages, a bulk retry with its preview, and the numbers refreshed
in place (not in a hidden tab). Each page's screenshot is written under
tests/artifacts/ for a person to look at.

Playwright runs inside this gevent-patched test process, next to the server.
Its sync API drives an asyncio loop from a greenlet of its own; under
monkey-patching that loop waits through gevent's selectors, so every wait
for the browser yields to the gevent hub, which meanwhile serves the admin
page's requests from this same process (checked with playwright 1.65 and
gevent 26.9, on Python 3.11 and 3.13). So the test reads and plants rows
directly, with no subprocess between it and the browser.
"""

import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg2
import pytest
from http_support import serving
from playwright.sync_api import Browser, Page, expect, sync_playwright
from programs import require

from lib.background import worker_registry
from lib.background.clock import Scheduled, daily, every
from lib.background.cron import cron
from lib.background.rollup import Rollup
from lib.http import metrics
from lib.http.admin import Admin, jobs
from lib.http.health import Health
from lib.http.httpd import make_app
from lib.insert import insert
from lib.operate import doctor, overview

PHONE = {"viewport": {"width": 390, "height": 844}, "device_scale_factor": 2, "is_mobile": True, "has_touch": True}

CHROMIUM = require("/usr/bin/chromium", "chromium")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
TOKEN = "browser-" + "t0ken" * 5
XSS = "<img src=x onerror=alert(1)>"


@pytest.fixture(autouse=True)
def exact_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every count these pages show is exact: on a loaded machine a page's
    40 ms of statement time can run out, and a count then shows the
    planner's estimate instead (tests/db/test_admin.py covers that)."""
    monkeypatch.setattr(jobs, "PAGE_BUDGET_MS", 5_000)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        # Debian's build: Playwright's own browser download cannot be had here.
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        yield browser
        browser.close()


@contextmanager
def admin_site(db, *, token: str | None = TOKEN, refresh: float = 3600.0, **options) -> Iterator[str]:
    admin = None
    if token:
        admin = Admin(
            db,
            token,
            queue_stats=overview.queue_stats,
            workers=overview.workers,
            queues=["mail", "sms"],
            refresh=refresh,
            **options,
        )
    with serving(make_app(Health(db), metrics.registry(), admin=admin)) as base:
        yield base


def shot(page: Page, name: str, *, full_page: bool = True) -> None:
    page.screenshot(path=str(ARTIFACTS / f"admin-{name}.png"), full_page=full_page)


def log_in(page: Page, base: str) -> None:
    page.goto(f"{base}/admin/")
    expect(page).to_have_url(f"{base}/admin/login")
    page.fill("#token", TOKEN)
    page.get_by_role("button", name="Log in").click()
    expect(page.locator("h1")).to_have_text("Queues")


def failed_job(db, queue: str, name: str, error: str, args: dict | None = None, traceback: str | None = None) -> int:
    job_id = insert(db, queue, name, args or {"to": "ops@example.com"})
    db.exec(
        "UPDATE jobs SET status = %s, last_error = %s, attempts = 1, max_attempts = 1, last_traceback = %s,"
        " worker_id = 'vm-1:4242:ab12cd34', run_at = now() - interval '3 seconds',"
        " started_at = now() - interval '2 seconds', finished_at = now()"
        " WHERE id = %s",
        (error, error, traceback, job_id),
    )
    return job_id


def queue_cell(page: Page, queue: str, column: str):
    return page.locator(f'#queues tr[data-queue="{queue}"] td.{column}')


def test_no_token_no_page(db, browser):
    with admin_site(db, token=None) as base:
        page = browser.new_page()
        answer = page.goto(f"{base}/admin/")
        assert answer.status == 404
        expect(page.locator("body")).to_contain_text("the admin page is off")
        shot(page, "off")
        page.close()


def test_log_in_see_the_queues_retry_a_failure_pause_and_resume(db, browser):
    for _ in range(3):
        insert(db, "sms", "sms.Send", {"to": "+100"})
    failed = failed_job(db, "mail", "mail.Send", "err: RuntimeError: smtp down", {"to": "ops@example.com", "n": 7})
    worker_registry.register(db, "vm-1:4242:ab12cd34", ["mail", "sms"], 30.0)
    # The watching tab reloads every second; the acting tab's page does not,
    # so no reload lands between a click and the next.
    with admin_site(db, refresh=1.0) as watch_base, admin_site(db) as base:
        context = browser.new_context(viewport={"width": 1100, "height": 700})
        page = context.new_page()
        page.goto(f"{base}/admin/")
        shot(page, "login")
        page.fill("#token", "not-the-token-at-all")
        page.get_by_role("button", name="Log in").click()
        expect(page.locator(".error")).to_have_text("wrong token")
        log_in(page, base)
        [cookie] = [c for c in context.cookies() if c["name"] == "jobs_admin"]
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert TOKEN not in cookie["value"]

        expect(queue_cell(page, "sms", "pending")).to_have_text("3")
        expect(queue_cell(page, "mail", "pending")).to_have_text("0")
        shot(page, "queues")

        # Another tab, left on the queues page: it refreshes by itself.
        watcher = context.new_page()
        watcher.goto(f"{watch_base}/admin/")
        expect(queue_cell(watcher, "mail", "pending")).to_have_text("0")

        page.get_by_role("link", name="Failures").click()
        row = page.locator(f'#failures tr[data-id="{failed}"]')
        expect(row.locator("td.err")).to_have_text("err: RuntimeError: smtp down")
        shot(page, "failures")
        row.get_by_role("button", name="Retry").click()
        expect(page.locator(".flash")).to_have_text(f"retried 1 jobs: {failed}")
        expect(row).to_have_count(0)
        assert db.query_row("SELECT status FROM jobs WHERE id = %s", (failed,))[0] == "pending"
        expect(queue_cell(watcher, "mail", "pending")).to_have_text("1", timeout=10_000)

        # One job: its args behind a click.
        page.goto(f"{base}/admin/jobs/{failed}")
        expect(page.locator("#job .status")).to_have_text("pending")
        args = page.locator("#args pre")
        expect(args).to_be_hidden()
        page.click("#args summary")
        expect(args).to_be_visible()
        expect(args).to_contain_text('"n": 7')
        shot(page, "job")

        page.get_by_role("link", name="Queues").click()
        queue_cell(page, "sms", "state").locator("xpath=..").locator("summary").click()
        form = page.locator('#queues tr[data-queue="sms"] form')
        form.locator('input[name="reason"]').fill("vendor outage, see #ops")
        form.get_by_role("button", name="Pause").click()
        expect(page.locator(".flash")).to_have_text("paused sms until resumed: vendor outage, see #ops")
        expect(queue_cell(page, "sms", "state")).to_contain_text("paused until resumed")
        expect(queue_cell(page, "sms", "state")).to_contain_text("vendor outage, see #ops")
        reason, forever = db.query_row(
            "SELECT pause_reason, paused_until = 'infinity' FROM job_queues WHERE queue = 'sms'"
        )
        assert re.fullmatch(r"vendor outage, see #ops \(session [0-9a-f]{8}, admin page\)", reason) and forever
        shot(page, "paused")
        page.locator('#queues tr[data-queue="sms"]').get_by_role("button", name="Resume").click()
        expect(page.locator(".flash")).to_have_text("resumed sms")
        expect(queue_cell(page, "sms", "state")).to_have_text("active")
        assert db.query_row("SELECT paused_until FROM job_queues WHERE queue = 'sms'") == (None,)

        page.get_by_role("link", name="Workers").click()
        expect(page.locator("#workers")).to_contain_text("vm-1:4242:ab12cd34")
        expect(page.locator("#workers .queues li")).to_have_text(["mail", "sms"])
        shot(page, "workers")

        page.get_by_role("button", name="Log out").click()
        expect(page).to_have_url(f"{base}/admin/login")
        page.goto(f"{base}/admin/failures")
        expect(page).to_have_url(f"{base}/admin/login")
        context.close()


def test_the_queues_page_reads_on_a_phone(db, browser):
    insert(db, "mail", "mail.Send", {"to": "a@example.com"})
    failed_job(db, "sms", "sms.Send", "err: HTTPError: 503 from the gateway")
    with admin_site(db) as base:
        context = browser.new_context(**PHONE)
        page = context.new_page()
        log_in(page, base)
        # Nothing wider than the screen but the table, which scrolls in its own box.
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        expect(queue_cell(page, "mail", "pending")).to_be_visible()
        shot(page, "queues-phone")
        page.get_by_role("link", name="Failures").click()
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        shot(page, "failures-phone")
        context.close()


def test_html_in_a_job_is_shown_as_text(db, browser):
    job_id = failed_job(db, "mail", XSS, f"err: ValueError: {XSS}", {"html": XSS})
    db.exec("INSERT INTO job_queues (queue, paused_until, pause_reason) VALUES ('mail', 'infinity', %s)", (XSS,))
    with admin_site(db) as base:
        page = browser.new_page()
        dialogs: list[str] = []
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        log_in(page, base)
        expect(queue_cell(page, "mail", "state")).to_contain_text(XSS)
        page.goto(f"{base}/admin/failures")
        expect(page.locator(f'#failures tr[data-id="{job_id}"] td.name')).to_have_text(XSS)
        expect(page.locator(f'#failures tr[data-id="{job_id}"] td.err')).to_have_text(f"err: ValueError: {XSS}")
        shot(page, "html-as-text")
        page.goto(f"{base}/admin/jobs/{job_id}")
        expect(page.locator("#job .name")).to_have_text(XSS)
        page.click("#args summary")
        expect(page.locator("#args pre")).to_contain_text(XSS)
        page.goto(f"{base}/admin/jobs")
        expect(page.locator(f'#jobs tr[data-id="{job_id}"] td.name')).to_have_text(XSS)
        # Typed into the search box: shown back as text, in the box and in the error.
        for q in (XSS, "{" + XSS):
            page.get_by_label("search").fill(q)
            page.get_by_label("search").press("Enter")
            expect(page.get_by_label("search")).to_have_value(q)
        expect(page.locator("#jobs-error")).to_contain_text("args search: not JSON")
        for path in ("/admin/", "/admin/failures", f"/admin/jobs/{job_id}", "/admin/jobs", f"/admin/jobs?q={XSS}"):
            page.goto(f"{base}{path}")
            # No element was made of the name: the page has no image at all.
            assert page.locator("img").count() == 0, path
        assert dialogs == []
        page.close()


def test_a_post_without_the_csrf_token_is_refused(db, browser):
    with admin_site(db) as base:
        context = browser.new_context()
        page = context.new_page()
        log_in(page, base)
        # The browser's own request context carries the session cookie, as a forged form would.
        refused = context.request.post(f"{base}/admin/pause", form={"queue": "mail", "reason": "forged"})
        assert refused.status == 403
        assert "CSRF" in refused.text()
        # A form without the token, submitted from the page itself.
        page.evaluate(
            """() => {
                const form = document.createElement("form");
                form.method = "post";
                form.action = "/admin/pause";
                for (const [name, value] of [["queue", "mail"], ["reason", "forged"]]) {
                    const input = document.createElement("input");
                    input.name = name;
                    input.value = value;
                    form.appendChild(input);
                }
                document.body.appendChild(form);
                form.submit();
            }"""
        )
        expect(page.locator("body")).to_contain_text("forbidden: missing or bad CSRF token")
        shot(page, "csrf-refused")
        context.close()
    assert not db.query("SELECT * FROM job_queues")


def ids_listed(page: Page) -> list[int]:
    return [int(i) for i in page.locator("#jobs tbody tr[data-id]").evaluate_all("rows => rows.map(r => r.dataset.id)")]


def plant_jobs(db) -> dict[str, int]:
    """A few jobs of two queues, in the states the list tells apart, with a
    customer's id in some of their args."""
    made = {}
    for n in range(4):
        made[f"sent{n}"] = insert(db, "mail", "mail.Send", {"to": f"user{n}@example.com", "customer_id": 40 + n})
        db.exec(
            "UPDATE jobs SET status = 'ok', attempts = 1, started_at = now(), finished_at = now() WHERE id = %s",
            (made[f"sent{n}"],),
        )
    made["scheduled"] = insert(db, "sms", "sms.Remind", {"customer_id": 42, "text": "your order ships"})
    db.exec("UPDATE jobs SET run_at = now() + interval '2 hours' WHERE id = %s", (made["scheduled"],))
    made["failed"] = failed_job(
        db,
        "sms",
        "sms.Send",
        "err: HTTPError: 503 from the gateway",
        {"customer_id": 42, "to": "+100", "api_key": "sk-live-never-shown"},
        'Traceback (most recent call last):\n  File "queues/sms/__init__.py", line 31, in send\n'
        "    response.raise_for_status()\nHTTPError: 503 from the gateway\n",
    )
    made["pending"] = insert(db, "mail", "mail.Digest", {"customer_id": 7})
    return made


def test_browse_filter_and_search_the_jobs(db, browser):
    made = plant_jobs(db)
    with admin_site(db) as base:
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        page = context.new_page()
        log_in(page, base)
        page.get_by_role("link", name="Jobs", exact=True).click()
        expect(page.locator("h1")).to_have_text("Jobs")
        assert ids_listed(page) == sorted(made.values(), reverse=True)
        expect(page.locator('#states a[data-state="all"] .n')).to_have_text("7")
        expect(page.locator('#states a[data-state="scheduled"] .n')).to_have_text("1")
        expect(page.locator('#states a[data-state="ok"] .n')).to_have_text("4")
        expect(page.locator(f'#jobs tr[data-id="{made["scheduled"]}"] .badge')).to_have_text("scheduled")
        shot(page, "jobs")

        # Filter: a state chip, then a queue from a row's link.
        page.locator('#states a[data-state="failed"]').click()
        assert ids_listed(page) == [made["failed"]]
        page.locator('#states a[data-state="all"]').click()
        page.locator(f'#jobs tr[data-id="{made["pending"]}"] td[data-label="queue"] a').click()
        expect(page).to_have_url(f"{base}/admin/jobs?queue=mail")
        assert ids_listed(page) == [made["pending"], made["sent3"], made["sent2"], made["sent1"], made["sent0"]]
        page.select_option('select[name="state"]', "ok")
        page.get_by_role("button", name="Search").click()
        assert ids_listed(page) == [made["sent3"], made["sent2"], made["sent1"], made["sent0"]]

        # Search: a name prefix, args, bad JSON, an id.
        page.goto(f"{base}/admin/jobs")
        search = page.get_by_label("search")
        search.fill("sms.")
        search.press("Enter")
        assert ids_listed(page) == [made["failed"], made["scheduled"]]
        search = page.get_by_label("search")
        search.fill('{"customer_id": 42}')
        search.press("Enter")
        assert ids_listed(page) == [made["failed"], made["scheduled"], made["sent2"]]
        shot(page, "jobs-search")
        search = page.get_by_label("search")
        search.fill('{"customer_id": 42')
        search.press("Enter")
        expect(page.locator("#jobs-error")).to_contain_text("args search: not JSON")
        assert ids_listed(page) == []
        search = page.get_by_label("search")
        search.fill(str(made["scheduled"]))
        search.press("Enter")
        expect(page).to_have_url(f"{base}/admin/jobs/{made['scheduled']}")
        expect(page.locator("h1")).to_contain_text(f"Job {made['scheduled']}")
        context.close()


def test_the_jobs_list_pages_and_reads_on_a_phone(db, browser):
    for n in range(55):
        insert(db, "mail", "mail.Send", {"n": n})
    failed_job(db, "sms", "sms.Send", "err: HTTPError: 503 from the gateway, which said a great deal about it")
    with admin_site(db) as base:
        context = browser.new_context(**PHONE)
        page = context.new_page()
        log_in(page, base)
        page.goto(f"{base}/admin/jobs")
        assert len(ids_listed(page)) == 50
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        shot(page, "jobs-phone", full_page=False)
        page.locator("#older").click()
        assert ids_listed(page) == list(range(6, 0, -1))
        shot(page, "jobs-phone-older")
        page.locator("#newest").click()
        assert ids_listed(page)[0] == 56
        context.close()


def test_a_jobs_traceback_then_retry_run_now_and_cancel(db, browser):
    made = plant_jobs(db)
    with admin_site(db) as base:
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        page = context.new_page()
        log_in(page, base)
        page.goto(f"{base}/admin/jobs/{made['failed']}")
        expect(page.locator("#last-error")).to_have_text("err: HTTPError: 503 from the gateway")
        expect(page.locator("#traceback")).to_contain_text('File "queues/sms/__init__.py", line 31, in send')
        expect(page.locator("#job .worker")).to_have_text("vm-1:4242:ab12cd34")
        expect(page.locator("#job .callsite")).to_contain_text("test_admin_browser.py")
        page.click("#args summary")
        expect(page.locator("#args pre")).to_contain_text('"api_key": "[redacted]"')
        expect(page.locator("#args pre")).not_to_contain_text("sk-live")
        shot(page, "job-failed")
        page.get_by_role("button", name="Retry").click()
        expect(page.locator(".flash")).to_have_text(
            f"retried job {made['failed']}: pending again, with one more attempt"
        )
        expect(page.locator("#job .status")).to_have_text("pending")
        assert db.query_row("SELECT status FROM jobs WHERE id = %s", (made["failed"],))[0] == "pending"

        page.get_by_role("link", name="jobs of queue sms").click()
        page.locator(f'#jobs tr[data-id="{made["scheduled"]}"] a').first.click()
        expect(page.locator("h1 .badge")).to_have_text("scheduled")
        page.get_by_role("button", name="Run now").click()
        expect(page.locator(".flash")).to_have_text(f"job {made['scheduled']} is due now")
        expect(page.get_by_role("button", name="Run now")).to_have_count(0)
        assert db.query_row("SELECT run_at <= now() FROM jobs WHERE id = %s", (made["scheduled"],)) == (True,)

        page.goto(f"{base}/admin/jobs/{made['pending']}")
        page.click("#actions summary")
        page.get_by_role("button", name=f"Cancel job {made['pending']}").click()
        expect(page.locator(".flash")).to_contain_text(f"cancelled job {made['pending']}")
        expect(page.locator("#job .status")).to_contain_text("skip: cancelled by an operator on the admin page")
        expect(page.locator("#actions")).to_have_count(0)
        shot(page, "job-cancelled")

        page.goto(f"{base}/admin/jobs/999999")
        expect(page.locator("h1")).to_have_text("Not found")
        expect(page.locator("#missing")).to_have_text("There is no job 999999: it never was, or it was deleted.")
        shot(page, "job-missing")
        context.close()

        phone = browser.new_context(**PHONE)
        page = phone.new_page()
        log_in(page, base)
        page.goto(f"{base}/admin/jobs/{made['sent1']}")
        page.click("#args summary")
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        shot(page, "job-phone")
        phone.close()


REGISTERED = {"mail": None, "sms": None, "github": "GITHUB_TOKEN is not set"}


def fits(page: Page, selector: str, within: str) -> bool:
    """Whether every element of selector lies inside its closest `within` ancestor's box."""
    return page.locator(selector).evaluate_all(
        """(els, within) => els.every(el => {
            const box = el.getBoundingClientRect(), outer = el.closest(within).getBoundingClientRect();
            return box.left >= outer.left - 0.5 && box.right <= outer.right + 0.5;
        })""",
        within,
    )


def test_the_queues_page_with_an_off_queue_an_unrun_queue_pause_and_resume(db, browser):
    worker_registry.register(db, "vm-1:4242:ab12cd34", ["mail", "sms"], 30.0, [("mail", ["mail.Send"])])
    insert(db, "mial", "mail.Send", {"to": "a@example.com"})  # a typo: no worker runs it
    for _ in range(2):
        insert(db, "sms", "sms.Send", {"to": "+100"})
    db.exec("INSERT INTO job_queues (queue, next_claim_at) VALUES ('mail', now() + interval '30 seconds')")
    with admin_site(db, registered=REGISTERED) as base:
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        log_in(page, base)
        rows = page.locator("#queues tbody tr")
        expect(rows).to_have_count(4)
        github = page.locator('#queues tr[data-queue="github"]')
        expect(github.locator(".badge")).to_have_text("off")
        expect(github).to_contain_text("GITHUB_TOKEN is not set")
        expect(github.locator("summary")).to_have_count(0)
        unrun = page.locator('#queues tr[data-queue="mial"]')
        expect(unrun.locator(".badge")).to_have_text("no worker")
        expect(unrun.locator("summary")).to_have_count(0)
        expect(queue_cell(page, "mial", "pending")).to_have_text("1")
        expect(queue_cell(page, "mail", "state")).to_contain_text("throttled until")
        expect(queue_cell(page, "mail", "state")).not_to_contain_text("for 0s")
        # The unrun queue's jobs are one click away.
        unrun.get_by_role("link", name="jobs").click()
        expect(page).to_have_url(f"{base}/admin/jobs?queue=mial")
        page.go_back()

        # The pause form, open at 1280 px, stays inside its row's cell and the table.
        page.locator('#queues tr[data-queue="sms"] summary').click()
        form = page.locator('#queues tr[data-queue="sms"] form')
        assert fits(
            page,
            '#queues tr[data-queue="sms"] form input:not([type=hidden]), #queues tr[data-queue="sms"] form button',
            "td",
        )
        assert fits(page, "#queues td.act", ".scroll")
        assert page.evaluate(
            "document.querySelector('.scroll').scrollWidth <= document.querySelector('.scroll').clientWidth"
        )
        shot(page, "queues-1280-pause-open", full_page=False)
        form.locator('input[name="reason"]').fill("vendor outage")
        form.locator('input[name="minutes"]').fill("30")
        form.get_by_role("button", name="Pause").click()
        expect(page.locator(".flash")).to_contain_text("paused sms until 20")
        expect(queue_cell(page, "sms", "state")).to_contain_text("paused until")
        expect(queue_cell(page, "sms", "state")).to_contain_text("vendor outage (session ")
        shot(page, "queues-1280")
        page.locator('#queues tr[data-queue="sms"]').get_by_role("button", name="Resume").click()
        expect(page.locator(".flash")).to_have_text("resumed sms")
        expect(queue_cell(page, "sms", "state")).to_have_text("active")
        context.close()

        phone = browser.new_context(**PHONE)
        page = phone.new_page()
        log_in(page, base)
        page.locator('#queues tr[data-queue="sms"] summary').click()
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        shot(page, "queues-phone-pause-open")
        phone.close()


def ran(db, queue: str, name: str, status: str, *, waited: float, minutes_ago: int) -> None:
    """A job that finished some minutes ago, having waited `waited` seconds to start."""
    job_id = insert(db, queue, name, {})
    db.exec(
        "UPDATE jobs SET status = %s, attempts = 1,"
        " finished_at = date_trunc('minute', now()) - make_interval(mins => %s) + interval '20 seconds',"
        " started_at = date_trunc('minute', now()) - make_interval(mins => %s) + interval '10 seconds',"
        " run_at = date_trunc('minute', now()) - make_interval(mins => %s) + interval '10 seconds'"
        " - make_interval(secs => %s)"
        " WHERE id = %s",
        (status, minutes_ago, minutes_ago, minutes_ago, waited, job_id),
    )


def test_a_queues_charts_after_jobs_ran(db, browser):
    worker_registry.register(db, "vm-1:4242:ab12cd34", ["mail", "sms"], 30.0)
    # A job or a few in each minute of the last hour, a failure now and then.
    totals = {"ok": 0, "fail": 0, "err": 0}
    for minutes_ago in range(1, 60):
        for _ in range(1 + minutes_ago * 7 % 5):
            ran(db, "mail", "mail.Send", "ok", waited=0.5 + minutes_ago % 10 * 0.3, minutes_ago=minutes_ago)
            totals["ok"] += 1
        if minutes_ago % 7 == 0:
            ran(db, "mail", "mail.Send", "err: RuntimeError: smtp down", waited=4.0, minutes_ago=minutes_ago)
            totals["err"] += 1
        if minutes_ago % 11 == 0:
            ran(db, "mail", "mail.Send", "fail: no such mailbox", waited=1.0, minutes_ago=minutes_ago)
            totals["fail"] += 1
    for _ in range(4):
        insert(db, "mail", "mail.Send", {})  # the backlog
    # The rollup, as a worker runs it each minute, over the last hour.
    now = datetime.now(UTC)
    rollup = Rollup(db)
    for back in range(59, -1, -1):
        assert rollup.roll_up(now - timedelta(minutes=back))
    with admin_site(db, registered=REGISTERED, refresh=5.0) as base:
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        log_in(page, base)
        charts = page.locator("#charts")
        expect(charts.locator("svg.chart")).to_have_count(3)
        expect(charts.locator(".chart-finished rect").first).to_be_visible()
        said = f"{totals['ok']} ok, {totals['fail']} fail, 0 skip, {totals['err']} err"
        expect(charts.locator(".chart-finished figcaption")).to_contain_text(said)
        expect(charts.locator(".chart-latency polyline")).not_to_have_count(0)
        expect(charts.locator(".chart-backlog polyline")).not_to_have_count(0)
        expect(queue_cell(page, "mail", "rate")).to_have_text(re.compile(r"^\d+(\.\d+)?/min$"))
        shot(page, "queues-charts")
        page.get_by_role("link", name="day").click()
        expect(page.locator('#charts[data-window="day"] .chart-finished rect').first).to_be_visible()
        page.locator('#queues tr[data-queue="mail"] td.head a').click()
        expect(page.locator("h1")).to_have_text("Queue mail")
        expect(page.locator("#charts-hour .chart-finished rect").first).to_be_visible()
        expect(page.locator("#charts-day .chart-finished rect").first).to_be_visible()
        shot(page, "queue")
        page.get_by_role("link", name="jobs of queue mail").click()
        expect(page).to_have_url(f"{base}/admin/jobs?queue=mail")
        context.close()

        phone = browser.new_context(**PHONE)
        page = phone.new_page()
        log_in(page, base)
        page.goto(f"{base}/admin/queue?queue=mail")
        expect(page.locator("#charts-hour svg.chart")).to_have_count(3)
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        shot(page, "queue-phone")
        phone.close()


def test_the_schedule_and_workers_pages(db, browser):
    schedule = [
        Scheduled("caches", "caches.Age", every(15)),
        Scheduled("maintenance", "maintenance.CleanUpJobs", daily(3, 17), catch_up=True),
        Scheduled("mail", "mail.Report", cron("0 9 * * 1-5", tz="Europe/Paris"), args={"to": "team@example.com"}),
    ]
    db.exec(
        "INSERT INTO clock_ticks (name, entry, minute) VALUES (%s, %s, date_trunc('minute', now()) - interval '7 minutes')",
        (schedule[0].name, schedule[0].key),
    )
    worker_registry.register(
        db, "vm-1:4242:ab12cd34", ["mail", "sms"], 30.0, [("mail", ["mail.Send", "mail.Report"]), ("sms", ["sms.Send"])]
    )
    worker_registry.register(db, "vm-2:77:ef56ab78", ["caches", "maintenance"], 30.0, [("caches", ["caches.Age"])])
    with admin_site(db, registered=REGISTERED, schedule=schedule) as base:
        for options, suffix in (({"viewport": {"width": 1280, "height": 800}}, ""), (PHONE, "-phone")):
            context = browser.new_context(**options)
            page = context.new_page()
            log_in(page, base)
            page.get_by_role("link", name="Schedule").click()
            age = page.locator('#schedule tr[data-name="caches.Age"]')
            expect(age.locator(".cadence")).to_have_text("every(15)")
            expect(age.locator(".next li")).to_have_count(3)
            # Planted 7 minutes before the minute began: 7m or, past a minute boundary during the test, 8m.
            expect(age.locator(".fired")).to_have_text(re.compile(r"^[78]m\d\ds ago$"))
            report = page.locator('#schedule tr[data-name="mail.Report"]')
            expect(report.locator(".cadence")).to_contain_text("cron('0 9 * * 1-5', tz='Europe/Paris')")
            expect(report.locator(".next li")).to_have_count(3)
            expect(report.locator(".fired")).to_have_text("not in the last 3 days")
            expect(page.locator('#schedule tr[data-name="maintenance.CleanUpJobs"] .cadence')).to_contain_text(
                "catches up"
            )
            assert page.evaluate("document.documentElement.scrollWidth") <= page.viewport_size["width"]
            # Each cell's text stays inside its row's card (or row), nothing cut off to the right.
            assert fits(page, "#schedule td > *", "tr")
            shot(page, f"schedule{suffix}")
            page.get_by_role("link", name="Workers").click()
            one = page.locator('#workers tr[data-worker="vm-1:4242:ab12cd34"]')
            expect(one.locator(".queues")).to_contain_text("mail: mail.Report, mail.Send")
            expect(one.locator(".queues")).to_contain_text("sms: sms.Send")
            expect(page.locator('#workers tr[data-worker="vm-2:77:ef56ab78"]')).to_contain_text("caches.Age")
            assert page.evaluate("document.documentElement.scrollWidth") <= page.viewport_size["width"]
            shot(page, f"workers{suffix}")
            context.close()


def test_the_database_page_with_a_held_transaction(db, database_url, browser, monkeypatch):
    """doctor's findings, a transaction held open elsewhere named bad at a
    threshold of nothing, every long line kept inside its card on a phone."""
    monkeypatch.setattr(doctor, "THRESHOLDS", doctor.Thresholds(horizon_warning=0.0, horizon_bad=0.0))
    held = psycopg2.connect(database_url, application_name="psql")
    try:
        with held.cursor() as cur:
            cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            cur.execute("SELECT count(*) FROM jobs WHERE status = 'pending' AND queue = 'a-rather-long-queue-name'")
        pid = held.info.backend_pid
        with admin_site(db) as base:
            for options, suffix in (({"viewport": {"width": 1280, "height": 800}}, ""), (PHONE, "-phone")):
                context = browser.new_context(**options)
                page = context.new_page()
                log_in(page, base)
                page.get_by_role("link", name="Database").click()
                expect(page.locator("#verdict")).to_have_text("bad")
                horizon = page.locator('#findings tr[data-finding="horizon"]')
                expect(horizon).to_contain_text(f"transaction pid {pid} (psql, role ")
                expect(horizon.locator(".advice")).to_contain_text(f"SELECT pg_terminate_backend({pid})")
                expect(page.locator('#findings tr[data-finding="migrations"]')).to_contain_text("ok")
                assert page.evaluate("document.documentElement.scrollWidth") <= page.viewport_size["width"]
                assert fits(page, "#findings td > *", "tr")
                # The findings' text has the card's width, not a column beside a label.
                widths = horizon.locator(".summary").evaluate("el => [el.offsetWidth, el.closest('tr').offsetWidth]")
                assert widths[0] > 0.8 * widths[1] or not suffix, widths
                shot(page, f"database{suffix}")
                context.close()
    finally:
        held.rollback()
        held.close()


def test_bulk_retry_with_its_preview_count(db, browser):
    made = plant_jobs(db)
    more = [failed_job(db, "sms", "sms.Send", "err: HTTPError: 502 from the gateway") for _ in range(2)]
    with admin_site(db, registered=REGISTERED) as base:
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        page = context.new_page()
        log_in(page, base)
        page.goto(f"{base}/admin/jobs?queue=sms")
        expect(page.locator('#states a[data-state="failed"] .n')).to_have_text("3")
        shot(page, "jobs-bulk-links")
        page.locator("#bulk-retry").click()
        expect(page.locator("#bulk-count")).to_contain_text("This will retry 3 failed jobs")
        shot(page, "bulk-preview")
        page.get_by_role("button", name="Retry 3 jobs").click()
        expect(page).to_have_url(f"{base}/admin/jobs?queue=sms")
        expect(page.locator(".flash")).to_have_text("retried 3 jobs")
        expect(page.locator('#states a[data-state="failed"] .n')).to_have_text("0")
        expect(page.locator("#bulk-retry")).to_have_count(0)
        assert {db.query_row("SELECT status FROM jobs WHERE id = %s", (i,))[0] for i in [made["failed"], *more]} == {
            "pending"
        }
        # Cancel asks once too, and shows what it will touch.
        page.goto(f"{base}/admin/jobs?state=scheduled")
        page.locator("#bulk-cancel").click()
        expect(page.locator("#bulk-count")).to_contain_text("This will cancel 1 scheduled job")
        page.get_by_role("button", name="Cancel 1 job").click()
        expect(page.locator(".flash")).to_contain_text("cancelled 1 jobs")
        assert db.query_row("SELECT status FROM jobs WHERE id = %s", (made["scheduled"],))[0].startswith(
            "skip: cancelled"
        )
        context.close()


def test_live_refresh_changes_a_number_without_a_reload_and_rests_in_a_hidden_tab(db, browser):
    worker_registry.register(db, "vm-1:4242:ab12cd34", ["mail", "sms"], 30.0)
    with admin_site(db, refresh=0.5, registered=REGISTERED) as base:
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        page = context.new_page()
        log_in(page, base)
        polls: list[str] = []
        page.on("request", lambda request: polls.append(request.url) if "/admin/live" in request.url else None)
        expect(queue_cell(page, "sms", "pending")).to_have_text("0")
        page.evaluate("window.notReloaded = true")
        # An open form with a reason typed: the refresh leaves it as it is.
        page.locator('#queues tr[data-queue="sms"] summary').click()
        page.locator('#queues tr[data-queue="sms"] input[name="reason"]').fill("half typed")
        for _ in range(3):
            insert(db, "sms", "sms.Send", {"to": "+100"})
        expect(queue_cell(page, "sms", "pending")).to_have_text("3", timeout=10_000)
        assert page.evaluate("window.notReloaded") is True
        expect(page.locator('#queues tr[data-queue="sms"] input[name="reason"]')).to_have_value("half typed")
        expect(page.locator('#queues tr[data-queue="sms"] details')).to_have_attribute("open", "")
        assert polls

        # Hidden: no request at all; shown again: at once.
        page.evaluate(
            """() => {
                Object.defineProperty(document, "visibilityState", { configurable: true, get: () => "hidden" });
                document.dispatchEvent(new Event("visibilitychange"));
            }"""
        )
        page.wait_for_timeout(600)  # a poll already on its way may land
        before = len(polls)
        insert(db, "sms", "sms.Send", {"to": "+100"})
        page.wait_for_timeout(2000)
        assert len(polls) == before
        expect(queue_cell(page, "sms", "pending")).to_have_text("3")
        page.evaluate(
            """() => {
                Object.defineProperty(document, "visibilityState", { configurable: true, get: () => "visible" });
                document.dispatchEvent(new Event("visibilitychange"));
            }"""
        )
        expect(queue_cell(page, "sms", "pending")).to_have_text("4", timeout=5000)
        assert page.evaluate("window.notReloaded") is True
        context.close()
