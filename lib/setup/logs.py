"""The worker's log: one event, one line. Messages carry names and texts read
from job rows and from servers; a newline or another control character in one
of them must not start a line that looks like the worker's own.

LOG_FORMAT=json writes each event as one JSON object (JSON escapes every
control character), with the fields a call passes in `extra=` as keys of
their own: the per-job line gives queue, job, id, status, latency, duration
and worker, so a log pipeline need not parse the message.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

from lib.setup.redact import scrubber

FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def one_line(text: str) -> str:
    """text with each control character written as its escape (a newline as \\n)."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


class OneLineFormatter(logging.Formatter):
    """The message on one line; a traceback, if any, follows as Python prints it."""

    def format(self, record: logging.LogRecord) -> str:
        msg, args = record.msg, record.args
        record.msg, record.args = one_line(record.getMessage()), None
        try:
            return super().format(record)
        finally:
            record.msg, record.args = msg, args


def json_formatter() -> logging.Formatter:
    """One JSON object per event: time (ISO, UTC), level, logger, message, any
    extra fields, and a traceback as exc_info."""
    # Imported here: a worker that logs text never loads python-json-logger.
    from pythonjsonlogger.json import JsonFormatter

    return JsonFormatter(
        "{levelname}{name}{message}",
        style="{",
        rename_fields={"levelname": "level", "name": "logger"},
        timestamp="time",
    )


class MaskingFormatter(logging.Formatter):
    """Another formatter's output with the configured secrets masked: a
    message or a traceback may quote a password or a token."""

    def __init__(self, inner: logging.Formatter, secrets: Iterable[str]) -> None:
        super().__init__()
        self.inner = inner
        self.scrub = scrubber(s for s in secrets if s)

    def format(self, record: logging.LogRecord) -> str:
        return self.scrub(self.inner.format(record))


def formatter(fmt: str = "text", secrets: Iterable[str] = ()) -> logging.Formatter:
    inner = json_formatter() if fmt == "json" else OneLineFormatter(FORMAT)
    return MaskingFormatter(inner, secrets)


def setup(level: str, fmt: str = "text", secrets: Iterable[str] = ()) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(formatter(fmt, secrets))
    logging.basicConfig(level=level, handlers=[handler])
