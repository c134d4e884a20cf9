"""The README's test command on a machine without the Debian packages three
test modules drive (chromium, pgbouncer, faketime), hidden here in a private
mount namespace: those modules are skipped, one line each naming the
package, and the run is green; under CI=true the same run is red."""

import os
import shutil
import subprocess

import pytest
from tests_support import ROOT

HIDDEN = {"chromium": "/usr/bin/chromium", "pgbouncer": "/usr/sbin/pgbouncer", "faketime": "/usr/bin/faketime"}
MODULES = [
    "tests/system/test_admin_browser.py",
    "tests/system/test_pgbouncer.py",
    "tests/system/test_clock_skew.py",
    "tests/db/test_status.py",
]

if os.geteuid() != 0 or shutil.which("unshare") is None:
    pytest.skip("hiding the packages needs root and unshare", allow_module_level=True)


def run_hidden(**env: str) -> subprocess.CompletedProcess:
    """./test.sh on MODULES with the programs bind-mounted over by /dev/null
    (not executable), in a mount namespace of its own."""
    hide = " && ".join(f"mount --bind /dev/null {path}" for path in HIDDEN.values() if os.path.exists(path))
    script = f"{hide + ' && ' if hide else ''}exec ./test.sh -q -p no:randomly {' '.join(MODULES)}"
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        cwd=ROOT,
        env={**os.environ, "CI": "", **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def skip_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if "needs the Debian package" in line]


def test_without_the_packages_their_tests_skip_with_one_line_each_and_the_run_is_green():
    done = run_hidden()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = skip_lines(done.stdout)
    assert len(lines) == len(HIDDEN), done.stdout[-3000:]
    for package in HIDDEN:
        assert sum(f"needs the Debian package {package} " in line for line in lines) == 1, lines


def test_under_ci_a_missing_package_fails_the_run():
    done = run_hidden(CI="true")
    assert done.returncode != 0, done.stdout[-3000:]
    for package in HIDDEN:
        assert f"needs the Debian package {package} " in done.stdout, done.stdout[-3000:]
