"""One Settings object: lib/setup/settings.py reads every variable, the README's
table lists exactly those, no other module of lib/ or queues/ reads the
environment, and every secret stays out of the settings' repr."""

import re
from collections.abc import Iterator, Mapping
from dataclasses import fields
from pathlib import Path

import pytest

from lib.clients import AnthropicClient, ApolloClient, GitHubClient, SlackClient
from lib.setup.parsers import SettingError
from lib.setup.redact import REDACTED
from lib.setup.settings import ENV, Settings

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = [GitHubClient, SlackClient, AnthropicClient, ApolloClient]

# A read of the environment, however it is spelled.
ENVIRON = re.compile(
    r"\bos\.(?:environb?|getenv|putenv|unsetenv)\b|\bgetenv\s*\(|from\s+os\s+import\s[^\n]*\b(?:environ|getenv)"
)


class Recording(Mapping[str, str]):
    """An environment that notes every name asked of it."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = values
        self.asked: list[str] = []

    def __getitem__(self, name: str) -> str:
        self.asked.append(name)
        return self.values[name]

    def get(self, name, default=None):  # type: ignore[no-untyped-def, override]
        self.asked.append(name)
        return self.values.get(name, default)

    def __iter__(self) -> Iterator[str]:
        raise AssertionError("from_env must ask for its variables by name, not list the environment")

    def __len__(self) -> int:
        return len(self.values)


def readme_settings_table() -> list[set[str]]:
    """The variables each row of the table under "## Settings" names in its first cell."""
    text = (ROOT / "README.md").read_text()
    section = re.search(r"^## Settings\n(.*?)(?=^## )", text, re.MULTILINE | re.DOTALL)
    assert section, "README.md has no section Settings"
    table = re.search(r"^\| setting \| meaning \|\n\| --- \| --- \|\n((?:\|.*\n)+)", section.group(1), re.MULTILINE)
    assert table, "the Settings section has no settings table"
    rows = [line.split("|")[1] for line in table.group(1).splitlines()]
    return [set(re.findall(r"`([A-Z][A-Z0-9_]*)`", cell)) for cell in rows]


def test_from_env_reads_exactly_the_variables_named_in_one_place():
    env = Recording({"JOBS_RETENTION_DAYS": "3", "GITHUB_TOKEN": "t", "UNRELATED": "x"})
    settings = Settings.from_env(env)
    assert sorted(env.asked) == sorted(ENV.values())
    assert (settings.retention_days, settings.github_token) == (3, "t")
    # One variable a field, none shared.
    assert set(ENV) == {f.name for f in fields(Settings)}
    assert len(set(ENV.values())) == len(ENV)


def test_the_readme_settings_table_lists_every_variable_read_and_only_those():
    rows = readme_settings_table()
    assert all(rows), f"a row of the table names no variable: {rows}"
    listed = set().union(*rows)
    read = set(ENV.values())
    assert (sorted(read - listed), sorted(listed - read)) == ([], []), "(read but not listed, listed but not read)"


def _sources() -> list[Path]:
    return sorted(p for folder in ("lib", "queues") for p in (ROOT / folder).rglob("*.py"))


def test_nothing_in_lib_or_queues_reads_the_environment_but_lib_settings():
    """The settings are read once, and passed down; a module reading a
    variable of its own would dodge the check at start (and the README's
    table). lib/store/pool_connections.py's one exception reads libpq's own
    variables, and lib/adapters/django_worker.py's sets Django's, each commented."""
    assert len(_sources()) > 20, "the scan found too few modules to be looking in the right place"
    found = []
    for path in _sources():
        name = path.relative_to(ROOT).as_posix()
        if name == "lib/setup/settings.py":
            continue
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines, 1):
            if not ENVIRON.search(line):
                continue
            allowed = (
                name == "lib/store/pool_connections.py"
                and line.strip() == "return os.environ.get(name)"
                and "libpq's own variables, not ours" in lines[number - 2]
            ) or (
                name == "lib/adapters/django_worker.py"
                and line.strip() == 'os.environ.setdefault("DJANGO_SETTINGS_MODULE", settings)'
                and "Django's own variable, not ours" in lines[number - 2]
            )
            if not allowed:
                found.append(f"{name}:{number}: {line.strip()}")
    assert found == []


def test_the_scan_would_see_a_read_of_the_environment():
    """The pattern above, on the spellings it must catch and the WSGI
    environ it must not."""
    for line in (
        'x = os.environ.get("X")',
        'os.environ["X"]',
        'os.getenv("X")',
        "from os import environ",
        "from os import path, getenv",
        'getenv("X")',
    ):
        assert ENVIRON.search(line), line
    for line in ("request = Request(environ)", 'self.environ.get("PATH_INFO")', "def __call__(self, environ, start):"):
        assert not ENVIRON.search(line), line


def test_every_secret_is_masked_in_the_repr():
    secret_fields = [f.name for f in fields(Settings) if f.metadata["secret"]]
    # Each client's token is a secret setting, under the variable its errors name.
    assert {ENV[name] for name in secret_fields} >= {c.TOKEN_ENV for c in CLIENTS} | {"JOBS_ADMIN_TOKEN"}
    assert {c.BASE_URL_ENV for c in CLIENTS} <= set(ENV.values())
    values = {ENV[name]: f"SEKRET-{n}-" + "x" * 16 for n, name in enumerate(secret_fields)}
    values |= {"DATABASE_URL": "postgresql://u:SEKRET-db@h/db", "DATABASE_DIRECT_URL": "host=h password=SEKRET-direct"}
    shown = repr(Settings.from_env(values))
    assert "SEKRET" not in shown
    assert shown.count(REDACTED) == len(values)
    # What is not a secret is shown, to say what the worker runs with.
    assert "retention_days=14" in repr(Settings()) and "github_token=None" in repr(Settings())


@pytest.mark.parametrize(
    ("env", "field", "value"),
    [
        ({}, "retention_days", 14),
        ({"JOBS_RETENTION_DAYS": " 30 "}, "retention_days", 30),
        ({"JOBS_RETENTION_DAYS": ""}, "retention_days", 14),
        ({"GITHUB_TOKEN": " ghp_abc\n"}, "github_token", "ghp_abc"),  # pasted with its line break
        ({"GITHUB_TOKEN": "   "}, "github_token", None),
        ({"SLACK_BASE_URL": " http://127.0.0.1:8080/api "}, "slack_base_url", "http://127.0.0.1:8080/api"),
        ({"SENTRY_DSN": "https://key@o1.ingest.sentry.io/42"}, "sentry_dsn", "https://key@o1.ingest.sentry.io/42"),
        ({"SENTRY_DSN": ""}, "sentry_dsn", None),
        ({"JOBS_DATA_DIR": "/srv/jobs/pgdata"}, "data_dir", Path("/srv/jobs/pgdata")),
        ({"JOBS_DATA_DIR": ""}, "data_dir", None),
        ({"JOBS_EMBEDDED": "System"}, "embedded", "system"),
        ({"JOBS_EMBEDDED": ""}, "embedded", None),
    ],
)
def test_a_setting_read(env, field, value):
    assert getattr(Settings.from_env(env), field) == value


@pytest.mark.parametrize("url", ["http://x", "http://api.github.com", "http://10.0.0.1:8080/api"])
def test_a_base_url_in_clear_text_is_refused_unless_it_is_loopback(url):
    """The token goes with every request: over http only to this machine."""
    with pytest.raises(SettingError, match=r"^GITHUB_BASE_URL must be https:// \(http:// only to a loopback host"):
        Settings.from_env({"GITHUB_BASE_URL": url})
    for local in ("http://127.0.0.1:8080/api", "http://localhost:9", "http://[::1]:9"):
        assert Settings.from_env({"GITHUB_BASE_URL": local}).github_base_url == local


def test_a_bad_sentry_dsn_is_named_but_never_shown():
    """An old DSN carries a secret key: the message says what a DSN looks like instead."""
    with pytest.raises(SettingError, match=r"^SENTRY_DSN must be a Sentry DSN") as refused:
        Settings.from_env({"SENTRY_DSN": "https://public:SEKRET@sentry.example/not-a-project"})
    assert "SEKRET" not in str(refused.value)


def test_a_bad_base_url_is_quoted_with_its_password_masked():
    """A proxy's URL may carry a password, which the message must not show."""
    with pytest.raises(SettingError, match=r"^GITHUB_BASE_URL must be an https:// URL") as refused:
        Settings.from_env({"GITHUB_BASE_URL": "ftp://user:SEKRET@proxy.example/github"})
    assert "SEKRET" not in str(refused.value) and "proxy.example" in str(refused.value)
