"""Database URLs as an operator may see them: the password found even in a
malformed URL or key/value DSN, masked, and where a DSN points."""

from __future__ import annotations

import re
from urllib.parse import unquote

from lib.setup.redact import scrub

# The password of a URL (scheme://user:password@host) or a key/value DSN
# (password=... or password='...'), as written: it may be malformed itself.
URL_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*://", re.IGNORECASE)
_QUERY_PASSWORD = re.compile(r"[?&]password=([^&#]*)")
_KV_PASSWORD = re.compile(r"(?:^|\s)password\s*=\s*(?:'(?P<quoted>(?:[^'\\]|\\.)*)'|(?P<bare>\S+))")


def dsn_password(dsn: str) -> str | None:
    """The password as written in a DSN (URL or key/value), even a malformed one."""
    url = URL_SCHEME.match(dsn.strip())
    if url:
        # Up to the last "@": a password may hold "/" or "@" when not encoded.
        rest = dsn.strip()[url.end() :]
        userinfo = rest.rsplit("@", 1)[0] if "@" in rest else ""
        if ":" in userinfo and userinfo.split(":", 1)[1]:
            return userinfo.split(":", 1)[1]
        query = _QUERY_PASSWORD.search(rest)
        return query.group(1) if query else None
    match = _KV_PASSWORD.search(dsn)
    if match:
        return match.group("quoted") or match.group("bare")
    return None


def dsn_secrets(dsn: str) -> list[str]:
    """The password of a DSN as written and percent-decoded: the forms an
    error or a URL may show it in."""
    written = dsn_password(dsn)
    return [written, unquote(written)] if written else []


def mask_secret(text: str, dsn: str) -> str:
    """text with the DSN's password masked."""
    return scrub(text, dsn_secrets(dsn))


def masked_dsn(dsn: str) -> str:
    """The DSN as an operator may see it: the password masked."""
    return mask_secret(dsn, dsn)


def dsn_place(dsn: str) -> str:
    """Where a DSN points, for a line an operator reads: each host:port,
    never the user or the password; a socket folder as itself."""
    import psycopg2.extensions

    try:
        options = psycopg2.extensions.parse_dsn(dsn)
    except psycopg2.Error:
        return "(a host it does not name)"  # check_dsn refuses such a DSN before any connect
    hosts = (options.get("host") or options.get("hostaddr") or "").split(",")
    ports = (options.get("port") or "").split(",")
    if len(ports) == 1:
        ports = ports * len(hosts)
    places = []
    for host, port in zip(hosts, ports, strict=False):
        port = port.strip() or "5432"
        if not host or host[0] in "/@":
            places.append(f"the socket in {host or 'the default folder'} (port {port})")
        else:
            places.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    return ", ".join(places)
