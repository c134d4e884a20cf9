"""The admin page's credentials: the token, the session cookie the login
sets (no token in it, but a signed expiry) and the CSRF token bound to a
session. Every value is signed with a key derived from the token, so none
reveals it, and a new token ends every session."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time

from lib.http.web import Request

COOKIE = "jobs_admin"
SESSION_SECONDS = 12 * 3600


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


class Sessions:
    def __init__(self, token: str) -> None:
        self._token_digest = _digest(token)
        self._key = hashlib.sha256(b"jobs-admin-key:" + token.encode()).digest()

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
