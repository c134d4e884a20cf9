"""Any text a job's status is made of, as a plain str that UTF-8 and
Postgres take: what a handler returned, an exception's description."""

from __future__ import annotations


def safe_text(text: str) -> str:
    """text as a plain str that UTF-8 and Postgres can take: each lone
    surrogate (half of an emoji, cut from an API's JSON) written as its
    escape, and each NUL as \\x00. A str subclass's own methods are not called."""
    text = str.__str__(text)
    try:
        text.encode()
    except UnicodeEncodeError:
        text = text.encode(errors="backslashreplace").decode()
    return text.replace("\x00", "\\x00")


def describe(exc: BaseException) -> str:
    """exc as "Type: message" ("Type" alone for an empty message), as
    safe_text. Never raises: an exception whose __str__ fails is described
    as unprintable, so it still becomes a status someone can read."""
    try:
        name = safe_text(type(exc).__name__)
    except Exception:
        name = "exception"
    try:
        message = safe_text(str(exc))
    except Exception as failure:
        return f"<unprintable {name}: __str__ raised {type(failure).__name__}>"
    return f"{name}: {message}" if message else name
