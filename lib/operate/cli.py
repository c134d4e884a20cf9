"""The worker's command line: its parser and the types of its arguments.

Imported only when there are arguments to read: a plain `python worker.py`
runs without it, so argparse (and gettext, which it imports) stays out of a
worker's memory.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TypeVar

from lib.setup.parsers import duration
from lib.setup.settings import Settings


def make_parser(settings: Settings) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="The jobs worker, and the commands to operate it.")
    window = "seconds running jobs get to finish after SIGTERM (default %(default)s, or JOBS_SHUTDOWN_WINDOW)"
    parser.add_argument("--shutdown-window", type=_seconds, default=settings.shutdown_window, help=window)
    commands = parser.add_subparsers(dest="command", metavar="command")
    run_ = commands.add_parser("run", help="run the worker (the default)")
    # Also after "run", where a reader of `run --help` looks for it; SUPPRESS
    # keeps a value given before "run" from being reset to the default.
    run_.add_argument("--shutdown-window", type=_seconds, default=argparse.SUPPRESS, help=window)
    commands.add_parser("migrate", help="apply the migrations not yet applied, and exit")
    check_ = commands.add_parser("check", help="fail when a job is written that no worker handles")
    check_.add_argument(
        "paths", nargs="*", type=_existing, metavar="PATH", help="also scan these files or folders (your own code)"
    )
    pause_ = commands.add_parser("pause", help="pause a queue for every worker")
    pause_.add_argument("queue", type=_text)
    pause_.add_argument("--reason", required=True, type=_text, help="why, for the operators who find it paused")
    pause_.add_argument("--minutes", type=_minutes, help="end the pause by itself after this long (default: never)")
    resume_ = commands.add_parser("resume", help="end a queue's pause")
    resume_.add_argument("queue", type=_text)
    scale_ = commands.add_parser("scale", help="set how many of a queue's jobs run at once, across every worker")
    scale_.add_argument("queue", type=_text)
    scale_.add_argument(
        "concurrency",
        type=_concurrency,
        help="from 1 to the queue's definition's concurrency, or 'default' for the definition's",
    )
    redrive_ = commands.add_parser("redrive", aliases=["retry"], help="give failed (err:) jobs another attempt")
    redrive_.add_argument("--queue", type=_text)
    redrive_.add_argument("--name", type=_text)
    redrive_.add_argument("--id", type=_job_id, nargs="+", action="extend", dest="ids", metavar="ID")
    redrive_.add_argument("--since", type=_duration, help="only jobs that failed within this long (30m, 1h, 2d)")
    redrive_.add_argument("--dry-run", action="store_true", help="say what would be done, change nothing")
    redrive_.add_argument(
        "--fresh", action="store_true", help="forget the jobs' stored steps: each starts over (default: kept)"
    )
    status_ = commands.add_parser("status", help="every queue and every worker, as the table shows them now")
    failed_ = commands.add_parser("failed", help="failed (err:) jobs, newest first (never their args)")
    failed_.add_argument("--queue", type=_text)
    failed_.add_argument("--name", type=_text)
    failed_.add_argument("--since", type=_duration, help="only jobs that failed within this long (30m, 1h, 2d)")
    failed_.add_argument("--limit", type=_limit, default=50, help="at most this many (default %(default)s)")
    show_ = commands.add_parser("show", help="one job in full, its args included")
    show_.add_argument("id", type=_job_id)
    enqueue_ = commands.add_parser("enqueue", help="enqueue one job (its callsite is recorded as cli)")
    enqueue_.add_argument("queue", type=_text)
    enqueue_.add_argument("name", type=_text)
    enqueue_.add_argument("args", type=_json_object, nargs="?", help="a JSON object (default {})")
    enqueue_.add_argument("--run-at", type=_instant, help="not before this ISO time with a zone (2026-05-01T14:00Z)")
    enqueue_.add_argument("--priority", type=_priority, default=0, help="higher runs first (default 0)")
    cancel_ = commands.add_parser(
        "cancel",
        help="end pending jobs as cancelled and stop running ones; ended ones are left alone and named",
    )
    cancel_.add_argument("ids", type=_job_id, nargs="+", metavar="ID")
    db_url = commands.add_parser("db-url", help="the URL of the database the worker uses, password masked")
    doctor_ = commands.add_parser(
        "doctor",
        help="what holds back vacuum, the jobs table's dead rows and size, the NOTIFY queue, transaction-ID age"
        " and whether this role can migrate; exit 1 when one is bad",
    )
    for command in (redrive_, status_, failed_, show_, enqueue_, cancel_, db_url, doctor_):
        command.add_argument("--json", action="store_true", help="print JSON, for scripts")
    return parser


# Argument types: a bad value is one line from argparse and exit code 2.


T = TypeVar("T")


def _seconds(text: str) -> float:
    value = _number(text)
    if not 0 <= value <= 86400:
        raise argparse.ArgumentTypeError(f"seconds from 0 to 86400, got {text!r}")
    return value


def _minutes(text: str) -> float:
    value = _number(text)
    # A pause of no time, or one already over, is a slip: "until resumed" is the default.
    if not 0 < value <= 525600:
        raise argparse.ArgumentTypeError(f"minutes above 0, at most a year (525600), got {text!r}")
    return value


def _number(text: str) -> float:
    value = _read(float, text, "a number")
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"a finite number, got {text!r}")
    return value


def _concurrency(text: str) -> int | None:
    if text == "default":
        return None
    value = _read(int, text, "a whole number of jobs, or 'default'")
    if value < 1:
        raise argparse.ArgumentTypeError(f"at least 1 job at a time, got {text}")
    return value


def _job_id(text: str) -> int:
    value = _read(int, text, "a job id (a whole number)")
    if value < 1:
        raise argparse.ArgumentTypeError(f"a job id is at least 1, got {text!r}")
    return value


def _read(convert: Callable[[str], T], text: str, what: str) -> T:
    """text read by convert, or argparse's error naming what was expected."""
    try:
        return convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what}, got {text!r}") from None


def _existing(text: str) -> Path:
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"no such file or folder: {text!r}")
    return path.resolve()


def _text(text: str) -> str:
    if not text.strip() or not text.isprintable():
        raise argparse.ArgumentTypeError(f"a non-empty text of printable characters, got {text!r}")
    return text


def _duration(text: str) -> float:
    try:
        return duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _limit(text: str) -> int:
    value = _read(int, text, "a whole number from 1 to 10000")
    if not 1 <= value <= 10000:
        raise argparse.ArgumentTypeError(f"a whole number from 1 to 10000, got {text!r}")
    return value


def _priority(text: str) -> int:
    value = _read(int, text, "a whole number")
    if not -(2**31) <= value < 2**31:  # the column is an int
        raise argparse.ArgumentTypeError(f"a priority within a 32-bit integer, got {text!r}")
    return value


def _instant(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        value = None
    # A time without a zone would mean whatever the host's zone is: refused, as lib.insert refuses it.
    if value is None or value.tzinfo is None:
        raise argparse.ArgumentTypeError(f"an ISO time with a zone, like 2026-05-01T14:00:00Z, got {text!r}")
    return value


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"a JSON object, got {text!r} ({exc})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"a JSON object, got {type(value).__name__} {text!r}")
    return value
