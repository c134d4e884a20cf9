"""The admin page in a real headless browser (Debian's chromium, driven by
Playwright): no token, no page; log in, see the queues, retry a failure and
see it pending, pause and resume, HTML in a job's name shown as text, and a
POST without the CSRF token refused. Each page's screenshot is written under
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


def shot(page: Page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"admin-{name}.png"), full_page=True)


def log_in(page: Page, base: str) -> None:
    page.goto(f"{base}/admin/")
    expect(page).to_have_url(f"{base}/admin/login")
    page.fill("#token", TOKEN)
    page.get_by_role("button", name="Log in").click()
    expect(page.locator("h1")).to_have_text("Queues")


def failed_job(db, queue: str, name: str, error: str, args: dict | None = None) -> int:
    job_id = insert(db, queue, name, args or {"to": "ops@example.com"})
    db.exec(
        "UPDATE jobs SET status = %s, last_error = %s, attempts = 1, max_attempts = 1,"
        " finished_at = now(), started_at = now() WHERE id = %s",
        (error, error, job_id),
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
        context = browser.new_context(
            viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True, has_touch=True
        )
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
        for path in ("/admin/", "/admin/failures", f"/admin/jobs/{job_id}"):
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
