"""Behaviour shared by every client: config, secrecy, errors, transport."""

from __future__ import annotations

import gzip
import json
import socket
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import requests

from lib.clients import (
    AnthropicClient,
    APIError,
    ApolloClient,
    AuthError,
    GitHubClient,
    NotConfigured,
    NotFoundError,
    RateLimitError,
    ServerError,
    SlackClient,
)
from lib.clients.base import extract_message
from lib.clients.resets import parse_epoch, parse_retry_after, parse_rfc3339
from lib.setup.settings import ENV, Settings

# One representative call per client, with the path the fake API should see.
CALLS: list[tuple[type[Any], Callable[[Any], Any], str]] = [
    (GitHubClient, lambda c: c.get_user("octocat"), "/users/octocat"),
    (SlackClient, lambda c: c.post_message("C1", "hi"), "/chat.postMessage"),
    (
        AnthropicClient,
        lambda c: c.create_message(model="m", max_tokens=1, messages=[]),
        "/v1/messages",
    ),
    (
        ApolloClient,
        lambda c: c.enrich_organization("apollo.io"),
        "/organizations/enrich",
    ),
]
SUCCESS_BODY = {"ok": True, "id": 1}
IDS = [cls.__name__ for cls, _, _ in CALLS]


def setting(settings: Settings, env: str) -> Any:
    """The value of the setting read from the variable env."""
    [name] = [name for name, var in ENV.items() if var == env]
    return getattr(settings, name)


# --- header parsing --------------------------------------------------------


def test_retry_after_seconds_is_relative_to_now(now: datetime) -> None:
    assert parse_retry_after("120", now) == now + timedelta(seconds=120)
    assert parse_retry_after(" 0 ", now) == now


def test_retry_after_http_date_is_absolute(now: datetime) -> None:
    moment = parse_retry_after("Wed, 02 Jan 2030 03:10:00 GMT", now)
    assert moment == datetime(2030, 1, 2, 3, 10, 0, tzinfo=UTC)


@pytest.mark.parametrize("value", [None, "", "soon", "12abc"])
def test_retry_after_unusable_is_none(value: str | None, now: datetime) -> None:
    assert parse_retry_after(value, now) is None


@pytest.mark.parametrize(
    ("value", "wait"),
    [
        ("inf", timedelta(days=1)),
        ("Infinity", timedelta(days=1)),
        ("1e12", timedelta(days=1)),
        ("3153600000", timedelta(days=1)),  # a century
        ("86401", timedelta(days=1)),
        ("86400", timedelta(days=1)),
        ("-inf", timedelta(0)),
        ("-30", timedelta(0)),
        ("Fri, 31 Dec 9999 23:59:59 GMT", timedelta(days=1)),
        ("Tue, 01 Jan 2030 00:00:00 GMT", timedelta(0)),  # already past
    ],
)
def test_retry_after_is_clamped_to_a_day(value: str, wait: timedelta, now: datetime) -> None:
    """inf and 1e12 raised (the job ended err: instead of waiting); a large
    finite value held a job for decades."""
    assert parse_retry_after(value, now) == now + wait


@pytest.mark.parametrize("value", ["nan", "NaN", "-nan"])
def test_retry_after_nan_is_unusable(value: str, now: datetime) -> None:
    assert parse_retry_after(value, now) is None


def test_epoch_and_rfc3339_parse_to_aware_utc() -> None:
    assert parse_epoch("1893553200") == datetime(2030, 1, 2, 3, 0, tzinfo=UTC)
    assert parse_epoch("x") is None
    assert parse_rfc3339("2030-01-02T03:05:00Z") == datetime(2030, 1, 2, 3, 5, tzinfo=UTC)
    assert parse_rfc3339("2030-01-02T04:05:00+01:00") == datetime(2030, 1, 2, 3, 5, tzinfo=UTC)
    assert parse_rfc3339("not a time") is None


def test_extract_message_prefers_api_message_and_truncates() -> None:
    assert extract_message({"message": "Not Found"}, "") == "Not Found"
    assert extract_message({"ok": False, "error": "channel_not_found"}, "") == "channel_not_found"
    assert extract_message({"type": "error", "error": {"message": "bad key"}}, "") == "bad key"
    assert extract_message(None, "<html>\n  <b>Bad   Gateway</b></html>") == ("<html> <b>Bad Gateway</b></html>")
    assert len(extract_message(None, "x" * 5000)) == 200
    assert extract_message(None, "") == "(empty body)"


def test_api_error_str_and_attributes() -> None:
    error = APIError(404, "GET", "/repos/a/b", "Not Found")
    assert str(error) == "GET /repos/a/b -> 404: Not Found"
    assert (error.status, error.method, error.path, error.message) == (
        404,
        "GET",
        "/repos/a/b",
        "Not Found",
    )


# --- configuration -----------------------------------------------------------


@pytest.mark.parametrize("cls", [c for c, _, _ in CALLS], ids=IDS)
@pytest.mark.parametrize("value", [None, "", "   "])
def test_missing_token_raises_not_configured(cls: type[Any], value: str | None) -> None:
    with pytest.raises(NotConfigured) as info:
        cls(value)
    assert cls.TOKEN_ENV in str(info.value)


@pytest.mark.parametrize(("cls", "call", "path"), CALLS, ids=IDS)
def test_token_and_base_url_from_the_settings(
    cls: type[Any], call: Callable[[Any], Any], path: str, fake_api: Any, token: str
) -> None:
    settings = Settings.from_env({cls.TOKEN_ENV: token, cls.BASE_URL_ENV: fake_api.url})
    fake_api.reply(200, SUCCESS_BODY)

    client = cls(setting(settings, cls.TOKEN_ENV), base_url=setting(settings, cls.BASE_URL_ENV))

    assert client.base_url == fake_api.url
    assert call(client) == SUCCESS_BODY
    assert fake_api.last.path == path
    assert token in " ".join(fake_api.last.headers.values())


def test_base_url_argument_is_used_without_its_trailing_slash(fake_api: Any, token: str) -> None:
    client = GitHubClient(token, base_url=fake_api.url + "/")
    fake_api.reply(200, {"login": "octocat"})

    assert client.get_user("octocat") == {"login": "octocat"}
    assert client.base_url == fake_api.url


def test_the_clients_never_read_the_environment(token: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The settings are read once, by lib/setup/settings.py: a variable set later
    (or read by no one) gives a client neither a token nor a base URL."""
    for cls, _, _ in CALLS:
        monkeypatch.setenv(cls.TOKEN_ENV, token)
        monkeypatch.setenv(cls.BASE_URL_ENV, "http://127.0.0.1:9")
        with pytest.raises(NotConfigured):
            cls()
    assert GitHubClient(token).base_url == "https://api.github.com"
    assert SlackClient(token).base_url == "https://slack.com/api"
    assert AnthropicClient(token).base_url == "https://api.anthropic.com"
    assert ApolloClient(token).base_url == "https://api.apollo.io/api/v1"


# --- secrecy -----------------------------------------------------------------


@pytest.mark.parametrize("cls", [c for c, _, _ in CALLS], ids=IDS)
def test_token_not_in_repr(cls: type[Any], make_client: Callable[..., Any], token: str) -> None:
    client = make_client(cls)
    assert token not in repr(client)
    assert cls.__name__ in repr(client)


@pytest.mark.parametrize(("cls", "call", "path"), CALLS, ids=IDS)
def test_token_echoed_by_api_is_redacted_from_error(
    cls: type[Any],
    call: Callable[[Any], Any],
    path: str,
    fake_api: Any,
    make_client: Callable[..., Any],
    token: str,
) -> None:
    fake_api.reply(401, {"message": f"invalid credential {token}"})
    with pytest.raises(AuthError) as info:
        call(make_client(cls))
    assert token not in str(info.value)
    assert token not in info.value.message
    assert "[redacted]" in info.value.message


def test_shared_session_does_not_carry_credentials(fake_api: Any, make_client: Callable[..., Any], token: str) -> None:
    session = requests.Session()
    github = make_client(GitHubClient, session=session)
    slack = make_client(SlackClient, session=session)
    fake_api.reply(200, {"login": "octocat"})
    fake_api.reply(200, {"ok": True})

    github.get_user("octocat")
    slack.post_message("C1", "hi")

    assert github.session is session and slack.session is session
    assert token not in " ".join(str(v) for v in session.headers.values())
    assert fake_api.received[1].headers["authorization"] == f"Bearer {token}"


def test_close_releases_only_an_owned_session(fake_api: Any, make_client: Callable[..., Any]) -> None:
    shared = requests.Session()
    owned_client = make_client(GitHubClient)
    shared_client = make_client(GitHubClient, session=shared)
    fake_api.reply(200, {"login": "a"})
    fake_api.reply(200, {"login": "b"})
    owned_client.get_user("a")
    shared_client.get_user("b")

    owned_client.close()
    shared_client.close()

    def open_pools(session: requests.Session) -> int:
        return len(session.get_adapter(fake_api.url).poolmanager.pools)

    assert open_pools(owned_client.session) == 0
    assert open_pools(shared) == 1
    shared.close()


# --- responses and transport -------------------------------------------------


def test_html_error_page_becomes_server_error_with_excerpt(fake_api: Any, make_client: Callable[..., Any]) -> None:
    fake_api.reply(
        502,
        "<html><body>" + "Bad Gateway " * 50 + "</body></html>",
        {"Content-Type": "text/html"},
    )
    with pytest.raises(ServerError) as info:
        make_client(GitHubClient).get_user("octocat")
    assert info.value.status == 502
    assert info.value.message.startswith("<html><body>Bad Gateway")
    assert len(info.value.message) <= 200


def test_success_without_json_is_an_api_error(fake_api: Any, make_client: Callable[..., Any]) -> None:
    fake_api.reply(200, "<html>login page</html>", {"Content-Type": "text/html"})
    with pytest.raises(APIError) as info:
        make_client(GitHubClient).get_user("octocat")
    assert info.value.status == 200
    assert "login page" in info.value.message


@pytest.mark.parametrize(("cls", "call", "path"), CALLS[1:], ids=IDS[1:])
@pytest.mark.parametrize("where", ["same-host", "other-host"])
def test_redirect_not_followed_by_clients_that_do_not_need_it(
    cls: type[Any],
    call: Callable[[Any], Any],
    path: str,
    where: str,
    fake_api: Any,
    other_host: Any,
    make_client: Callable[..., Any],
) -> None:
    """Anthropic and Apollo send their key in x-api-key, which requests keeps
    on a redirect to anywhere; Slack has no redirect to follow."""
    target = (fake_api.url if where == "same-host" else other_host.url) + "/steal"
    fake_api.reply(302, {"message": "moved"}, {"Location": target})
    with pytest.raises(APIError, match="redirect not followed") as info:
        call(make_client(cls))
    assert info.value.status == 302
    assert len(fake_api.received) == 1
    assert other_host.received == []


def test_github_follows_redirect_for_renamed_repo(fake_api: Any, make_client: Callable[..., Any], token: str) -> None:
    fake_api.reply(
        301,
        {"message": "Moved Permanently"},
        {"Location": fake_api.url + "/repositories/42"},
    )
    fake_api.reply(200, {"id": 42, "full_name": "new/name"})

    assert make_client(GitHubClient).get_repo("old", "name") == {
        "id": 42,
        "full_name": "new/name",
    }
    assert [r.path for r in fake_api.received] == [
        "/repos/old/name",
        "/repositories/42",
    ]
    assert fake_api.received[1].headers["authorization"] == f"Bearer {token}"


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_github_refuses_a_redirect_to_another_host(
    status: int, fake_api: Any, other_host: Any, make_client: Callable[..., Any]
) -> None:
    """requests would follow it (without Authorization), and the other host's
    answer would be stored as GitHub's."""
    fake_api.reply(status, {"message": "Moved"}, {"Location": other_host.url + "/repositories/42"})
    other_host.reply(200, {"id": 42, "full_name": "evil/repo"})
    with pytest.raises(APIError, match="redirect to another host") as info:
        make_client(GitHubClient).get_repo("old", "name")
    assert info.value.status == status
    assert other_host.received == []


def test_github_stops_following_a_redirect_loop(fake_api: Any, make_client: Callable[..., Any]) -> None:
    for _ in range(10):
        fake_api.reply(302, {"message": "Found"}, {"Location": fake_api.url + "/users/octocat"})
    with pytest.raises(APIError, match="redirects"):
        make_client(GitHubClient).get_user("octocat")
    assert len(fake_api.received) == 6  # the request and five redirects


def test_connection_refused_propagates_as_requests_error(
    make_client: Callable[..., Any],
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = make_client(GitHubClient, base_url=f"http://127.0.0.1:{port}")
    with pytest.raises(requests.ConnectionError) as info:
        client.get_user("octocat")
    assert not isinstance(info.value, APIError)


def test_read_timeout_propagates_as_requests_timeout(fake_api: Any, make_client: Callable[..., Any]) -> None:
    fake_api.reply(200, {"ok": True}, delay=1.0)
    client = make_client(SlackClient, timeout=(2.0, 0.2))
    with pytest.raises(requests.Timeout):
        client.post_message("C1", "hi")


def test_error_path_has_no_query_string(fake_api: Any, make_client: Callable[..., Any]) -> None:
    fake_api.reply(404, {"error": "not found"})
    with pytest.raises(NotFoundError) as info:
        make_client(ApolloClient).enrich_organization("secret-domain.example")
    assert info.value.path == "/organizations/enrich"
    assert "secret-domain" not in str(info.value)


def test_rate_limit_error_is_an_api_error() -> None:
    # Callers catching APIError must also catch the more specific kinds.
    for kind in (AuthError, RateLimitError, ServerError, NotFoundError):
        assert issubclass(kind, APIError)


# --- tokens checked at start --------------------------------------------------

# Recognisable pieces of the bad tokens below: none may appear in a reason or
# an error ("TOKEN" alone would match the variable's name).
BAD_TOKEN_PIECES = ("sekret", "1234")


@pytest.mark.parametrize("cls", [c for c, _, _ in CALLS], ids=IDS)
@pytest.mark.parametrize(
    "bad",
    [
        "sekret-TOKEN\n1234",
        "sekret-TOKEN\r\n1234",
        "sekret TOKEN-1234",
        "sekret\tTOKEN-1234",
        "sekret\x00TOKEN-1234",
        "sekret\x7fTOKEN-1234",
        "sekret\u2028TOKEN-1234",
        "sekret\u00a0TOKEN-1234",
    ],
    ids=["newline", "crlf", "space", "tab", "nul", "del", "line-separator", "nbsp"],
)
def test_token_with_whitespace_or_control_character_is_refused(cls: type[Any], bad: str) -> None:
    if "\x00" not in bad:  # the environment cannot hold a NUL; an argument can
        # As the worker reads it: the settings keep it (stripped), and building the client refuses it.
        with pytest.raises(NotConfigured) as info:
            cls(setting(Settings.from_env({cls.TOKEN_ENV: bad}), cls.TOKEN_ENV))
        reason = str(info.value)
        assert cls.TOKEN_ENV in reason
        assert not any(piece in reason for piece in BAD_TOKEN_PIECES), reason
    with pytest.raises(NotConfigured) as info:
        cls(bad)
    assert not any(piece in str(info.value) for piece in BAD_TOKEN_PIECES)


@pytest.mark.parametrize(("cls", "call", "path"), CALLS, ids=IDS)
def test_client_scrubs_its_token_from_request_errors(
    cls: type[Any], call: Callable[[Any], Any], path: str, make_client: Callable[..., Any]
) -> None:
    """Defence in depth: were a bad token to get past the check, requests'
    InvalidHeader quotes the header value (token included) in its text."""
    client = make_client(cls)
    client._token = "sekret-TOKEN\n1234"
    with pytest.raises(requests.RequestException) as info:
        call(client)
    texts = []
    exc: BaseException | None = info.value
    while exc is not None:
        texts += [str(exc), repr(exc)]
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    assert "[redacted]" in texts[0]
    assert not any(piece in text for piece in BAD_TOKEN_PIECES for text in texts), texts


class _Leaky(requests.adapters.HTTPAdapter):
    """A transport whose error quotes the request's headers (a proxy's error page, a debug wrapper)."""

    def send(self, request: requests.PreparedRequest, *args: Any, **kwargs: Any) -> requests.Response:
        inner = ValueError(f"send failed with headers {dict(request.headers)}")
        raise requests.ConnectionError(f"connection failed: {inner}") from inner


@pytest.mark.parametrize(("cls", "call", "path"), CALLS, ids=IDS)
def test_client_scrubs_its_token_from_a_chained_transport_error(
    cls: type[Any], call: Callable[[Any], Any], path: str, make_client: Callable[..., Any], token: str
) -> None:
    session = requests.Session()
    session.mount("http://", _Leaky())
    with pytest.raises(requests.ConnectionError) as info:
        call(make_client(cls, session=session))
    assert "[redacted]" in str(info.value)
    assert token not in str(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__


# --- paths --------------------------------------------------------------------


@pytest.mark.parametrize("cls", [c for c, _, _ in CALLS], ids=IDS)
@pytest.mark.parametrize(
    "path",
    ["/a/../b", "/a/./b", "/..", "/a/%2e%2e/b", "/a/%2E/b", "//a", "/a//b", "/a/", "a/b", "/a/b%2Fc", "/a/b%5cc"],
)
def test_a_path_with_a_dot_or_empty_segment_is_refused_unsent(
    cls: type[Any], path: str, fake_api: Any, make_client: Callable[..., Any]
) -> None:
    """Any segment the server or urllib3 would resolve or collapse is refused,
    whatever built the path."""
    with pytest.raises(ValueError, match="path") as info:
        make_client(cls)._request("GET", path)
    assert type(info.value).__name__ == "InvalidArgument"
    assert fake_api.received == []


def test_a_query_string_is_not_a_path(fake_api: Any, make_client: Callable[..., Any]) -> None:
    fake_api.reply(200, {"ok": True})
    make_client(GitHubClient)._request("GET", "/search?q=a/../b")
    assert fake_api.last.target == "/search?q=a/../b"


# --- response size -------------------------------------------------------------

MiB = 1024 * 1024


def _padded(size: int) -> bytes:
    """A JSON success body (for every client) of exactly size bytes."""
    head, tail = b'{"ok": true, "pad": "', b'"}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


@pytest.mark.parametrize(("cls", "call", "path"), CALLS, ids=IDS)
@pytest.mark.parametrize("length", [True, False], ids=["content-length", "until-close"])
def test_a_response_over_the_cap_is_refused(
    cls: type[Any], call: Callable[[Any], Any], path: str, length: bool, fake_api: Any, make_client: Callable[..., Any]
) -> None:
    """Read whole before, whatever its size: a runaway or hostile answer could
    take the worker's memory."""
    fake_api.reply(200, _padded(10 * MiB + 1), length=length)
    with pytest.raises(APIError, match="larger than 10 MiB") as info:
        call(make_client(cls))
    assert info.value.status == 200


def test_a_compressed_response_is_capped_as_decompressed(fake_api: Any, make_client: Callable[..., Any]) -> None:
    bomb = gzip.compress(_padded(11 * MiB))
    assert len(bomb) < MiB
    fake_api.reply(200, bomb, {"Content-Encoding": "gzip"})
    with pytest.raises(APIError, match="larger than 10 MiB"):
        make_client(SlackClient).post_message("C1", "hi")


@pytest.mark.parametrize("length", [True, False], ids=["content-length", "until-close"])
def test_a_response_at_the_cap_is_read(length: bool, fake_api: Any, make_client: Callable[..., Any]) -> None:
    fake_api.reply(200, _padded(10 * MiB), length=length)
    assert len(json.dumps(make_client(SlackClient).post_message("C1", "hi"))) == 10 * MiB
