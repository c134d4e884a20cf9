"""Take known secrets out of text, in each form text shows them in.

Pure and dependency-free: the API clients scrub their own token with it, and
lib/setup/error_reports.py masks Sentry events with it, without importing each other.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable

REDACTED = "[redacted]"


def forms(secret: str) -> set[str]:
    """The secret as str() shows it, and as repr(), ascii() and JSON escape it.

    An error message often holds a repr: requests refuses a header with a
    newline by quoting 'Bearer abc\\ndef', where the raw token is not found.
    """
    if not secret:
        return set()
    return {secret, repr(secret)[1:-1], ascii(secret)[1:-1], json.dumps(secret)[1:-1]}


def scrubber(secrets: Iterable[str]) -> Callable[[str], str]:
    """scrub() for these secrets, their forms worked out once (for a log
    formatter, which scrubs every line)."""
    # Longest first: a form that contains another is replaced whole, not left
    # with a tail of escapes around a REDACTED.
    ordered = sorted({f for s in secrets for f in forms(s)}, key=len, reverse=True)

    def scrub_(text: str) -> str:
        for form in ordered:
            text = text.replace(form, REDACTED)
        return text

    return scrub_


def scrub(text: str, secrets: Iterable[str]) -> str:
    """text with every form of every secret replaced by REDACTED."""
    return scrubber(secrets)(text)


def carries(text: str, secrets: Iterable[str]) -> bool:
    return any(form in text for s in secrets for form in forms(s))
