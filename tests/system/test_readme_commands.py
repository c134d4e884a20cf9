"""Every command line the README and docs/operating.md show (`$ python
worker.py ...` in their examples, and `python worker.py ...` in their text,
either with `.venv/bin/` before it) is one the worker takes: it parses, and it
runs without a usage error, against the test database, in a copy of the
checkout where the README's "Write a queue" was followed (its examples use
that queue)."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from test_first_hour import copy_project
from tests_support import ROOT

PAGES = [ROOT / "README.md", ROOT / "docs" / "operating.md"]
TEXT = "\n".join(page.read_text() for page in PAGES)
PYTHON = r"(?:\.venv/bin/)?python worker\.py"
# An example line, or an inline `python worker.py ...` of the text; not one
# that pipes into another program (psql "$(...)").
LINES = sorted(
    {m.strip() for m in re.findall(rf"^\$ {PYTHON}([^\n#]*)", TEXT, re.M)}
    | {m.strip() for m in re.findall(rf"`{PYTHON}([^`]*)`", TEXT)}
)
LINES = [line for line in LINES if "$(" not in line and "|" not in line]


def test_the_pages_show_command_lines():
    # A rename of the examples' prompt must not turn the test below into a no-op.
    readme_lines = re.findall(rf"^\$ {PYTHON}", PAGES[0].read_text(), re.M)
    assert len(readme_lines) >= 6 and len(LINES) >= 12, LINES


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_project(tmp_path_factory.mktemp("readme"))


@pytest.mark.parametrize("line", LINES)
def test_a_documented_command_line_is_one_the_worker_takes(db, database_url, project, tmp_path, line):
    # The example of an application's folder stands for one that exists.
    argv = [str(tmp_path) if arg == "../myapp" else arg for arg in shlex.split(line)]
    if argv[:1] in (["run"], []):
        argv = [*argv, "--help"]  # the worker itself: only that it parses
    done = subprocess.run(
        [sys.executable, "worker.py", *argv],
        cwd=project,
        env={**os.environ, "DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    # 0, or 1 for an answer about rows this database lacks (no job 56, say); never a usage error.
    assert done.returncode in (0, 1), done.stdout + done.stderr
    assert "usage:" not in done.stderr and "Traceback" not in done.stderr, done.stderr
