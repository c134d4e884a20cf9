"""The admin page in a real headless browser (Debian's chromium, driven by
Playwright): no token, no page; log in, see the queues, retry a failure and
see it pending, pause and resume; browse, filter and search the jobs, read a
job's traceback, cancel, run now and retry it; HTML in a job's name shown as
text, and a POST without the CSRF token refused. Each page's screenshot is written under
tests/artifacts/ for a person to look at.

Playwright runs inside this gevent-patched test process, next to the server.
Its sync API drives an asyncio loop from a greenlet of its own; under
monkey-patching that loop waits through gevent's selectors, so every wait
for the browser yields to the gevent hub, which meanwhile serves the admin
page's requests from this same process (checked with playwright 1.65 and
gevent 26.9, on Python 3.11 and 3.13). So the test reads and plants rows
directly, with no subprocess between it and the browser.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from http_support import serving
from playwright.sync_api import Browser, Page, expect, sync_playwright
from programs import require

from lib.background import worker_registry
from lib.http import metrics
from lib.http.admin import Admin
from lib.http.health import Health
from lib.http.httpd import make_app
from lib.insert import insert
from lib.operate import overview

PHONE = {"viewport": {"width": 390, "height": 844}, "device_scale_factor": 2, "is_mobile": True, "has_touch": True}

CHROMIUM = require("/usr/bin/chromium", "chromium")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
TOKEN = "browser-" + "t0ken" * 5
XSS = "<img src=x onerror=alert(1)>"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        # Debian's build: Playwright's own browser download cannot be had here.
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        yield browser
        browser.close()


@contextmanager
def admin_site(db, *, token: str | None = TOKEN, refresh: float = 3600.0) -> Iterator[str]:
    admin = None
    if token:
        admin = Admin(
            db,
            token,
            queue_stats=overview.queue_stats,
            workers=overview.workers,
            queues=["mail", "sms"],
            refresh=refresh,
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
        assert db.query_row("SELECT pause_reason, paused_until = 'infinity' FROM job_queues WHERE queue = 'sms'") == (
            "vendor outage, see #ops",
            True,
        )
        shot(page, "paused")
        page.locator('#queues tr[data-queue="sms"]').get_by_role("button", name="Resume").click()
        expect(page.locator(".flash")).to_have_text("resumed sms")
        expect(queue_cell(page, "sms", "state")).to_have_text("active")
        assert db.query_row("SELECT paused_until FROM job_queues WHERE queue = 'sms'") == (None,)

        page.get_by_role("link", name="Workers").click()
        expect(page.locator("#workers")).to_contain_text("vm-1:4242:ab12cd34")
        expect(page.locator("#workers")).to_contain_text("mail, sms")
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
