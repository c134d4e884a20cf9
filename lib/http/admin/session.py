"""The admin page's credentials: the token, the session cookie the login
sets (no token in it, but a signed expiry) and the CSRF token bound to a
session. Every value is signed with a key derived from the token, so none
reveals it, and a new token ends every session. A wrong credential waits
its turn at the process's gate (guesses.py) before it is answered."""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import time

from lib.http.admin.guesses import BEARER, FORGED, Guesses
from lib.http.admin.render import PREFIX
from lib.http.web import Request, Response, redirect, text

COOKIE = "jobs_admin"
SESSION_SECONDS = 12 * 3600
# The answer to a request that presents a credential while every place at
# the gate is taken: given before the credential is read, so it says nothing of it.
BUSY = "too many wrong credentials are waiting their turn; try again in a few seconds"


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


class Forged(Exception):
    """A session cookie of the right shape whose signature is not ours."""


class Sessions:
    def __init__(self, token: str) -> None:
        self._token_digest = _digest(token)
        self._key = hashlib.sha256(b"jobs-admin-key:" + token.encode()).digest()
        self.guesses = Guesses()

    def _who(self, request: Request, path: str) -> tuple[Response | None, str | None]:
        """(None, the session; None for the bearer token) for a request with a
        good credential, else (the answer, None). A correct credential never
        waits behind the guesses at the gate, so an operator's script goes on
        through an attack; that tells a guesser nothing the rate of guessing
        depends on, since each wrong answer, and the connection it came on,
        is still held until its turn. Only while every place is taken is a
        credential turned away, unread, right or wrong alike."""
        address = str(request.environ.get("REMOTE_ADDR") or "?")
        bearer = request.header("Authorization")
        if self.guesses.full() and (bearer is not None or request.cookie(COOKIE) is not None):
            self.guesses.turned_away(address)
            return Response(429, BUSY + "\n", headers=busy_headers(self.guesses.penalty)), None
        if bearer is not None:
            scheme, _, given = bearer.partition(" ")
            if scheme.lower() == "bearer" and self._token_ok(given.strip()):
                return None, None
            self.guesses.wait_turn(BEARER, address)
            return text(401, "unauthorized: bad bearer token"), None
        try:
            session = self._session(request)
        except Forged:
            self.guesses.wait_turn(FORGED, address)
            session = None
        if session is not None:
            return None, session
        if request.method in ("GET", "HEAD") and path != "/live":
            return redirect(f"{PREFIX}/login"), None
        return text(401, "unauthorized: log in first"), None

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
        """The request's session cookie when it is ours and unexpired; Forged
        when it has a session's shape and a signature we did not make (one
        signed with the token before it was changed, too: its key is not
        ours). An expired one of ours is no guess: only we could sign it."""
        value = request.cookie(COOKIE)
        if not value or value.count(".") != 2:
            return None
        body, sig = value.rsplit(".", 1)
        if not hmac.compare_digest(sig, self._sign("session:" + body)):
            raise Forged
        expires = body.split(".", 1)[0]
        if not expires.isdigit() or int(expires) < time.time():
            return None
        return value

    def _csrf(self, session: str) -> str:
        return self._sign("csrf:" + session)


def busy_headers(penalty: float) -> list[tuple[str, str]]:
    """A place at the gate frees each penalty."""
    return [("Retry-After", str(max(1, math.ceil(penalty))))]
