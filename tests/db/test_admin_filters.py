"""Every filter of every admin page answers what it cannot read with the
page's "bad filter" answer, a 400 with the reason on the page (an action: a
redirect whose message says nothing was done), never a 500: an age or a time
out of range, a NUL, bytes that are not UTF-8, a lone surrogate, a number
too large, text too long. The next request is served as ever."""

import logging
import re
from urllib.parse import quote, unquote

import pytest
import requests
from factory import make_job
from test_admin import AUTH, whole_site

# (page, raw query string, what the page says); the query as a browser or a
# script could send it, percent-escapes and all.
BAD_GETS = [
    ("/admin/jobs", "since=999999d", "created after: a duration like 30m, 1h or 2d, above 0 and at most 36500d"),
    ("/admin/jobs", "until=99999999999999999999999d", "created before: a duration like 30m"),
    ("/admin/jobs", "since=0d", "created after: a duration like 30m"),
    ("/admin/jobs", "since=0001-01-01T00:00%2B23:59", "is not a time"),
    ("/admin/jobs", "until=9999-12-31T23:59-23:59", "is not a time"),
    ("/admin/jobs", "queue=mail%00", "queue: not text"),
    ("/admin/jobs", "name=%FF%FE", "name: not text"),
    ("/admin/jobs", "q=%ED%A0%80", "q: not text"),
    ("/admin/jobs", "q=" + quote('{"to": "\\ud800"}'), "lone surrogate"),
    ("/admin/jobs", "q=" + quote('{"to": 1e999}'), "beyond a double"),
    ("/admin/jobs", "q=" + "9" * 5000, "q: at most 1000 characters"),
    ("/admin/jobs", "state=" + "x" * 5000, "state: at most 1000 characters"),
    ("/admin/jobs", "before=%C2%B2", "before is a job id"),
    ("/admin/jobs", "before=" + "9" * 30, "before is a job id"),
    ("/admin/jobs/bulk", "action=retry&since=999999d", "created after: a duration like 30m"),
    ("/admin/jobs/bulk", "action=cancel&queue=%00", "queue: not text"),
    ("/admin/failures", "queue=%00", "queue: not text"),
    ("/admin/failures", "name=mail.Send%00", "name: not text"),
    ("/admin/failures", "queue=%ED%A0%80", "queue: not text"),
    ("/admin/failures", "name=" + "n" * 1001, "name: at most 1000 characters"),
    ("/admin/queue", "queue=%00", "queue: not text"),
    ("/admin/queue", "queue=" + "q" * 5000, "queue: at most 1000 characters"),
    ("/admin/", "window=%FF", "window: not text"),
    ("/admin/live", "page=queue&queue=%00", "queue: not text"),
    ("/admin/live", "page=%00", "page: not text"),
]
# Where each page writes its message.
SAID_IN = {"/admin/jobs": "jobs-error", "/admin/jobs/bulk": "jobs-error", "/admin/failures": "failures-error"}
# The forms: (action, fields, what the message after the redirect says).
BAD_POSTS = [
    ("/admin/retry", {"queue": "mail\x00"}, "nothing done: queue: not text"),
    ("/admin/retry", {"name": "n" * 1001}, "nothing done: name: at most 1000 characters"),
    ("/admin/retry", {"id": "\u00b2"}, "nothing done: id: a job id is a whole number"),
    ("/admin/retry", {"id": "9" * 5000}, "nothing done: id: a job id is a whole number"),
    ("/admin/resume", {"queue": "mail\x00"}, "nothing done: queue: not text"),
    ("/admin/pause", {"queue": "mail\x00", "reason": "x"}, "nothing done: queue: not text"),
    ("/admin/scale", {"queue": "mail", "concurrency": "\u00b2"}, "nothing done: mail runs from 1 to 2"),
    ("/admin/scale", {"queue": "mail", "concurrency": "9" * 5000}, "nothing done: mail runs from 1 to 2"),
    ("/admin/jobs/bulk", {"action": "retry", "since": "999999d"}, "nothing done: created after: a duration like"),
    ("/admin/jobs/bulk", {"action": "cancel", "name": "\x00"}, "nothing done: name: not text"),
]


@pytest.fixture
def site(db):
    make_job(db, "mail", "mail.Send", status="err: RuntimeError: smtp down")
    with whole_site(db, concurrency={"mail": 2}) as base:
        yield base


def served_again(base: str) -> None:
    for page in ("/admin/jobs", "/admin/failures", "/admin/"):
        answer = requests.get(f"{base}{page}", headers=AUTH, timeout=10)
        assert answer.status_code == 200, page


@pytest.mark.parametrize(("page", "query", "said"), BAD_GETS, ids=[f"{p}?{q[:30]}" for p, q, _ in BAD_GETS])
def test_a_filter_the_page_cannot_read_is_a_bad_filter_answer(site, caplog, page, query, said):
    with caplog.at_level(logging.INFO, logger="jobs"):
        answer = requests.get(f"{site}{page}?{query}", headers=AUTH, timeout=10)
    assert answer.status_code == 400, answer.text[:300]
    if page == "/admin/live":
        assert said in answer.text
    else:
        found = re.search(rf'id="{SAID_IN.get(page, "missing")}">([^<]*)<', answer.text)
        assert found and said in found.group(1).replace("&#39;", "'"), answer.text[:2000]
    assert "Traceback" not in caplog.text and "internal error" not in answer.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    served_again(site)


@pytest.mark.parametrize(("action", "fields", "said"), BAD_POSTS, ids=[f"{a} {str(f)[:30]}" for a, f, _ in BAD_POSTS])
def test_a_form_value_an_action_cannot_read_does_nothing_and_says_so(site, db, caplog, action, fields, said):
    before = db.query("SELECT id, status FROM jobs ORDER BY id"), db.query("SELECT * FROM job_queues")
    with caplog.at_level(logging.INFO, logger="jobs"):
        answer = requests.post(f"{site}{action}", data=fields, headers=AUTH, allow_redirects=False, timeout=10)
    assert answer.status_code == 303, answer.text[:300]
    assert unquote(answer.cookies["jobs_admin_flash"]).startswith(said)
    assert "Traceback" not in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert (db.query("SELECT id, status FROM jobs ORDER BY id"), db.query("SELECT * FROM job_queues")) == before
    served_again(site)
