"""The admin page's gate for wrong credentials (lib/http/admin/guesses.py),
through the page's own WSGI app: a wrong bearer token, login token or forged
session cookie waits its turn behind every other, from anywhere; a correct
token is answered at once; with every place taken a credential is turned
away unread; a run of guesses is two log lines; and nothing kept grows with
the number of clients. The page is built without a database: a wrong
credential and its wait, which must hold no connection, touch none. The same
against a real worker process is tests/system/test_admin_guess_process.py."""

import io
import itertools
import logging
import re
import time
import tracemalloc
from urllib.parse import urlencode

import gevent

from lib.http.admin import Admin, guesses

TOKEN = "admin-" + "t0ken" * 5
FORGED = "9999999999.00ff." + "0" * 64  # a session's shape, a signature nobody made


def admin() -> Admin:
    return Admin(None, TOKEN, queue_stats=lambda *a, **k: [], workers=lambda *a, **k: [])


def call(app: Admin, path: str = "/admin/nowhere", *, address: str = "127.0.0.1", **credential: str) -> int:
    """The status of one request, presenting bearer=, login= or cookie=."""
    body = b""
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": "", "REMOTE_ADDR": address}
    if "bearer" in credential:
        environ["HTTP_AUTHORIZATION"] = f"Bearer {credential['bearer']}"
    if "cookie" in credential:
        environ["HTTP_COOKIE"] = f"jobs_admin={credential['cookie']}"
    if "login" in credential:
        body = urlencode({"token": credential["login"]}).encode()
        environ |= {"REQUEST_METHOD": "POST", "PATH_INFO": "/admin/login"}
    environ |= {"wsgi.input": io.BytesIO(body), "CONTENT_LENGTH": str(len(body))}
    status: list[int] = []
    b"".join(app(environ, lambda line, headers: status.append(int(line.split()[0]))))
    return status[0]


def wrong(i: int) -> dict[str, str]:
    """The i-th wrong credential, of each kind in turn."""
    return [{"bearer": f"guess-{i}"}, {"login": f"guess-{i}"}, {"cookie": FORGED}][i % 3]


def test_wrong_credentials_sent_side_by_side_are_answered_one_per_penalty(monkeypatch):
    monkeypatch.setattr(guesses, "PENALTY", 0.05)
    app = admin()
    ends: list[float] = []

    def guess(i: int) -> int:
        status = call(app, address=f"10.0.0.{i}", **wrong(i))
        ends.append(time.monotonic())
        return status

    started = time.monotonic()
    sent = [gevent.spawn(guess, i) for i in range(30)]
    gevent.joinall(sent, timeout=30, raise_error=True)
    assert sorted(g.value for g in sent) == [303] * 10 + [401] * 10 + [403] * 10
    assert ends[-1] - started >= 30 * 0.05 * 0.95
    gaps = [b - a for a, b in itertools.pairwise(ends)]
    assert min(gaps) >= 0.05 * 0.9, gaps
    assert app.guesses.waiting == 0


def test_a_correct_token_is_answered_while_guesses_wait_their_turn(monkeypatch):
    """An operator's script goes on through an attack: its token never waits behind the guesses."""
    monkeypatch.setattr(guesses, "PENALTY", 1.0)
    app = admin()
    sent = [gevent.spawn(call, app, bearer=f"guess-{i}") for i in range(10)]
    gevent.sleep(0.05)
    assert app.guesses.waiting == 10
    assert call(app, bearer=TOKEN) == 404  # the page, as /admin/nowhere has none
    assert call(app, login=TOKEN) == 303
    assert app.guesses.waiting >= 9, "the correct token waited behind the guesses"
    gevent.killall(sent)
    assert app.guesses.waiting == 0


def test_with_every_place_taken_a_credential_is_turned_away_unread(monkeypatch):
    """Past PLACES the page does not look at a credential, right or wrong:
    an answer at once to a wrong one would tell a guesser more than its turn does."""
    monkeypatch.setattr(guesses, "PENALTY", 0.2)
    monkeypatch.setattr(guesses, "PLACES", 3)
    app = admin()
    sent = [gevent.spawn(call, app, bearer=f"guess-{i}") for i in range(3)]
    gevent.sleep(0.05)
    for credential in ({"bearer": TOKEN}, {"bearer": "guess"}, {"cookie": FORGED}, {"login": TOKEN}):
        assert call(app, **credential) == 429, credential
    assert app.guesses.waiting == 3
    assert call(app, "/admin/login") == 200  # no credential: nothing to turn away
    assert call(app, "/admin/") == 303  # to the login form
    gevent.joinall(sent, timeout=30, raise_error=True)
    assert call(app, bearer=TOKEN) == 404
    assert app.guesses.run is not None and app.guesses.run.kinds[guesses.TURNED_AWAY] == 4


def test_a_run_of_guesses_is_one_line_when_it_starts_and_one_with_its_counts_when_it_ends(monkeypatch, caplog):
    monkeypatch.setattr(guesses, "PENALTY", 0.0)
    monkeypatch.setattr(guesses, "QUIET", 0.3)
    app = admin()
    with caplog.at_level(logging.WARNING, logger="jobs.admin"):
        for i in range(30):
            call(app, address=f"10.0.0.{i % 2}", **wrong(i))
        assert len(caplog.records) == 1
        assert "wrong bearer token from 10.0.0.0" in caplog.text
        gevent.sleep(0.6)
        assert app.guesses.run is None
        assert len(caplog.records) == 2
        ended = caplog.records[1].getMessage()
        assert re.fullmatch(
            r"admin: wrong credentials stopped: 30 in \d+s"
            r" \(forged session cookie 10, wrong bearer token 10, wrong login token 10\)"
            r" from 10\.0\.0\.0, 10\.0\.0\.1",
            ended,
        ), ended
        # A lone typo later: its own run, one line.
        call(app, login="typo")
        gevent.sleep(0.6)
    assert len(caplog.records) == 3
    assert "guess-" not in caplog.text and TOKEN not in caplog.text


def test_guesses_from_many_addresses_keep_a_bounded_record(monkeypatch):
    monkeypatch.setattr(guesses, "PENALTY", 0.0)
    guessed = 2_000
    app = admin()

    def guess_from(first: int, n: int) -> None:
        for i in range(first, first + n):
            assert call(app, address=f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}", **wrong(i)) in (303, 401, 403)

    guess_from(0, guessed)
    tracemalloc.start()
    try:
        before = _held_by_the_page()
        guess_from(guessed, 10 * guessed)
        grown = _held_by_the_page() - before
    finally:
        tracemalloc.stop()
    run = app.guesses.run
    assert run is not None and run.kinds.total() == 11 * guessed
    assert len(run.addresses) == guesses.ADDRESSES_KEPT and run.more_addresses
    assert grown < 10_000, f"the page holds {grown} more bytes after {10 * guessed} more guesses"


def _held_by_the_page() -> int:
    """Bytes allocated by the admin page's modules and still held."""
    gevent.sleep(0)
    snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, "*/lib/http/admin/*")])
    return sum(stat.size for stat in snapshot.statistics("filename"))
