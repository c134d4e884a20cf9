"""Every command line the README shows (`$ python worker.py ...` in its
examples, and `python worker.py ...` in its text) is one the worker takes: it
parses, and it runs without a usage error, against the test database."""

import os
import re
import shlex
import subprocess
import sys

import pytest
from tests_support import ROOT

README = (ROOT / "README.md").read_text()
# An example line, or an inline `python worker.py ...` of the text; not one
# that pipes into another program (psql "$(...)").
LINES = sorted(
    {m.strip() for m in re.findall(r"^\$ python worker\.py([^\n#]*)", README, re.M)}
    | {m.strip() for m in re.findall(r"`python worker\.py([^`]*)`", README)}
)
LINES = [line for line in LINES if "$(" not in line and "|" not in line]


def test_the_readme_shows_command_lines():
    # A rename of the examples' prompt must not turn the test below into a no-op.
    assert len(LINES) >= 8, LINES


@pytest.mark.parametrize("line", LINES)
def test_a_readme_command_line_is_one_the_worker_takes(db, database_url, tmp_path, line):
    # The README's example of an application's folder stands for one that exists.
    argv = [str(tmp_path) if arg == "../myapp" else arg for arg in shlex.split(line)]
    if argv[:1] in (["run"], []):
        argv = [*argv, "--help"]  # the worker itself: only that it parses
    done = subprocess.run(
        [sys.executable, "worker.py", *argv],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    # 0, or 1 for an answer about rows this database lacks (no job 56, say); never a usage error.
    assert done.returncode in (0, 1), done.stdout + done.stderr
    assert "usage:" not in done.stderr and "Traceback" not in done.stderr, done.stderr
