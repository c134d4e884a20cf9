"""Sentry events carry no configured secret, wherever in the event it landed."""

import json
import logging

import sentry_sdk
from tests_support import run_python

from lib.job.text import describe
from lib.setup import error_reports
from lib.setup.settings import Settings

SECRETS = {
    "GITHUB_TOKEN": "sekret-TOKEN-1234",
    "SLACK_BOT_TOKEN": "xoxb-sekret-SLACK-1234",
    "ANTHROPIC_API_KEY": "sk-ant-sekret-ANTHROPIC-1234",
    "APOLLO_API_KEY": "sekret-APOLLO-1234",
}
DB_PASSWORD = "pw-SEKRET-5678"


def test_before_send_masks_the_configured_secrets_everywhere(sentry_events, settings_of):
    settings_of({**SECRETS, "DATABASE_URL": f"postgresql://jobs:{DB_PASSWORD}@db.example:5432/jobs"})
    everything = " ".join([*SECRETS.values(), DB_PASSWORD])
    # A log record becomes a breadcrumb of the next event.
    logging.getLogger("jobs.test").warning("about to fail: %s", everything)
    with sentry_sdk.new_scope() as scope:
        scope.set_extra("url", f"postgresql://jobs:{DB_PASSWORD}@db.example:5432/jobs")
        scope.set_context("request", {"headers": {"Authorization": "Bearer " + SECRETS["GITHUB_TOKEN"]}})
        try:
            try:
                raise ValueError("inner " + SECRETS["APOLLO_API_KEY"])
            except ValueError as inner:
                raise RuntimeError(f"boom {everything}") from inner
        except RuntimeError as exc:
            error_reports.capture(exc, message=f"what: {everything}", token=SECRETS["SLACK_BOT_TOKEN"])
    error_reports.capture_message(f"said: {everything}", key=SECRETS["ANTHROPIC_API_KEY"])

    assert len(sentry_events) == 2
    dump = json.dumps(sentry_events)
    for secret in [*SECRETS.values(), DB_PASSWORD]:
        assert secret not in dump
    assert "[redacted]" in dump
    # Masked, not dropped: the event still says what happened.
    assert "boom [redacted]" in dump and "inner [redacted]" in dump


def test_the_secrets_are_the_settings_tokens_and_database_passwords(settings_of):
    env = {var: f" {value}\n" for var, value in SECRETS.items()}  # the settings strip them
    settings_of({**env, "DATABASE_URL": "postgresql://jobs:p%40ss%2Fword@db.example/jobs"})
    # What every event, stored traceback and job status is masked of from now on.
    found = error_reports.configured_secrets()
    assert set(SECRETS.values()) <= set(found)
    # As libpq reads it, and as written in the URL.
    assert {"p@ss/word", "p%40ss%2Fword"} <= set(found)

    for url in (
        f"host=db.example user=jobs password={DB_PASSWORD} dbname=jobs",
        f"postgresql://db.example/jobs?user=jobs&password={DB_PASSWORD}",
        # A URL no parser accepts (urlsplit and libpq refuse it) still has its password found.
        f"postgresql://jobs:{DB_PASSWORD}@[::1/jobs",
    ):
        assert DB_PASSWORD in error_reports.settings_secrets(Settings(database_url=url)), url
    assert DB_PASSWORD in error_reports.settings_secrets(Settings(direct_url=f"postgresql://u:{DB_PASSWORD}@h/db"))
    admin = "admin-SEKRET-" + "x" * 16
    assert error_reports.settings_secrets(Settings(admin_token=admin)) == [admin]
    assert error_reports.settings_secrets(Settings()) == []


def test_mask_walks_every_container_and_leaves_the_rest():
    event = {
        "message": "a sekret-TOKEN-1234 b",
        "list": [1, None, ("x", "sekret-TOKEN-1234")],
        "nested": {"sekret-TOKEN-1234": {"deep": "'sekret-TOKEN-1234'"}},
        "level": "error",
    }
    assert error_reports.mask(event, ["sekret-TOKEN-1234"]) == {
        "message": "a [redacted] b",
        "list": [1, None, ("x", "[redacted]")],
        "nested": {"[redacted]": {"deep": "'[redacted]'"}},
        "level": "error",
    }


_WITHOUT_GEVENT = """
import sys
sys.modules["gevent"] = sys.modules["greenlet"] = None  # as if not installed: importing them fails
from lib.setup import error_reports
from lib.setup.settings import Settings
error_reports.configure(Settings.from_environ())
print(error_reports.mask({"m": ["a s3cr3t"]}, error_reports.configured_secrets()))
"""


def test_errors_works_without_gevent():
    """A guard, not a fix: a plain synchronous program may report through it."""
    result = run_python(_WITHOUT_GEVENT, env={"GITHUB_TOKEN": "s3cr3t"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "{'m': ['a [redacted]']}"


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise ValueError("no text")


def test_describe_and_traceback_text_make_text_of_any_exception():
    """Half an emoji, a NUL, a __str__ that raises: each becomes text UTF-8
    encodes, and nothing raises."""
    try:
        raise RuntimeError("cut \ud83d and \x00")
    except RuntimeError as exc:
        cut = exc
    assert describe(cut) == "RuntimeError: cut \\ud83d and \\x00"
    text = error_reports.traceback_text(cut)
    assert text.encode() and text.endswith("RuntimeError: cut \\ud83d and \\x00\n")
    assert describe(_Unprintable()) == "<unprintable _Unprintable: __str__ raised ValueError>"
    assert describe(KeyError()) == "KeyError"
    try:
        raise _Unprintable()
    except _Unprintable as exc:
        assert "_Unprintable: <exception str() failed>" in error_reports.traceback_text(exc)
    cut_long = RuntimeError("\ud83d" * 10_000)
    try:
        raise cut_long
    except RuntimeError:
        text = error_reports.traceback_text(cut_long)
    assert len(text.encode()) <= error_reports.MAX_TRACEBACK_BYTES and text.endswith("\\ud83d\n")


def test_an_error_is_reported_once_and_not_at_all_once_marked_told(sentry_events: list) -> None:
    """capture() of one exception twice sends one event; one marked reported
    (its run of failures was reported for it) sends none."""
    first, second = RuntimeError("first"), RuntimeError("second")
    error_reports.capture(first)
    error_reports.capture(first)
    error_reports.reported(second)
    error_reports.capture(second)
    assert [e["exception"]["values"][0]["value"] for e in sentry_events] == ["first"]
