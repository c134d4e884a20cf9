"""The worker's log: one event, one line. Messages carry names and texts read
from job rows and from servers; a newline or another control character in one
of them must not start a line that looks like the worker's own."""

from __future__ import annotations

import logging
import re

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


def setup(level: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(OneLineFormatter(FORMAT))
    logging.basicConfig(level=level, handlers=[handler])
