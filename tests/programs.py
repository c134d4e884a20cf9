"""The programs Python cannot install that some test modules drive: Debian
packages. A module whose program is missing is skipped as it is collected, so
the run says so in one line naming the package; under CI=true
tests/conftest.py makes that skip a failure, so CI never passes without them."""

from __future__ import annotations

import os

import pytest

# The start of every such skip's reason, which tests/conftest.py looks for.
MISSING = "needs the Debian package"


def require(path: str, package: str) -> str:
    """path, when it is an executable; else the calling test module is
    skipped, naming package. Called at a module's top level."""
    if not os.access(path, os.X_OK):
        pytest.skip(
            f"{MISSING} {package} ({path} is missing): apt-get install -y {package}, as ./test.sh does as root",
            allow_module_level=True,
        )
    return path
