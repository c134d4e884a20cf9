"""Secrets stay where they belong: each token goes to its own API, in its own
header, and nowhere else (no other header, job row, log line or Sentry event)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from conftest import NOW

from lib.clients import AnthropicClient, ApolloClient, GitHubClient, SlackClient

SECRET = "sekret-TOKEN-1234"

# Each client, one call, and the one header its token belongs in (as sent).
CLIENTS: list[tuple[type[Any], Callable[[Any], Any], str, str]] = [
    (GitHubClient, lambda c: c.get_user("octocat"), "authorization", f"Bearer {SECRET}"),
    (SlackClient, lambda c: c.post_message("C1", "hi"), "authorization", f"Bearer {SECRET}"),
    (
        AnthropicClient,
        lambda c: c.create_message(model="m", max_tokens=1, messages=[]),
        "x-api-key",
        SECRET,
    ),
    (ApolloClient, lambda c: c.enrich_organization("apollo.io"), "x-api-key", SECRET),
]
IDS = [cls.__name__ for cls, *_ in CLIENTS]


@pytest.mark.parametrize(("cls", "call", "header", "value"), CLIENTS, ids=IDS)
def test_no_trace_headers_go_to_the_apis(cls, call, header, value, fake_api, sentry_events):
    """sentry-sdk adds sentry-trace and baggage to every outgoing request unless
    told not to: they are no business of a third party."""
    fake_api.reply(200, {"ok": True})
    call(cls(SECRET, base_url=fake_api.url, now=lambda: NOW))
    sent = fake_api.last.headers
    assert "sentry-trace" not in sent and "baggage" not in sent, sent
    assert sent[header] == value
