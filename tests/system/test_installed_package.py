"""What `pip install` of this checkout gives an application: the lib package
and its SQL files, and no dependency, so no gevent. Built as a wheel, offline,
into a bare virtualenv of the suite's own interpreter."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# What a new virtualenv may hold besides what is installed into it (3.11's ensurepip gives setuptools).
ENSUREPIP = {"pip", "setuptools"}


def run(*argv: str | Path, cwd: Path) -> str:
    # No PYTHONPATH: the bare virtualenv must find lib in its own site-packages.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    done = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_installed_package_is_lib_without_gevent(tmp_path: Path):
    # Built from a copy: a build writes build/ and jobs.egg-info beside the sources.
    source = tmp_path / "source"
    ignore = shutil.ignore_patterns("__pycache__")
    for part in ("lib", "sql"):
        shutil.copytree(ROOT / part, source / part, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", source)
    wheels = tmp_path / "wheels"
    build = ("wheel", "-q", "--no-deps", "--no-build-isolation", "-w", wheels, source)
    run(sys.executable, "-m", "pip", *build, cwd=tmp_path)
    # Without a pip of its own (ensurepip takes seconds): the suite's pip installs into it.
    run(sys.executable, "-m", "venv", "--without-pip", tmp_path / "app", cwd=tmp_path)
    python = tmp_path / "app" / "bin" / "python"
    pip = (sys.executable, "-m", "pip", "--python", python)
    run(*pip, "install", "-q", "--no-index", "--find-links", wheels, "jobs", cwd=tmp_path)

    installed = {p["name"] for p in json.loads(run(*pip, "list", "--format=json", cwd=tmp_path))}
    assert "jobs" in installed and installed - ENSUREPIP == {"jobs"}, installed
    probe = (
        "import importlib.util, sys\n"
        "import lib.insert\n"
        "from lib.store.sql import Q\n"
        "assert importlib.util.find_spec('gevent') is None, 'gevent is importable'\n"
        "assert importlib.util.find_spec('lib.adapters.django_tasks') is not None\n"
        "print(lib.insert.__file__, bool(Q.job_insert and Q.job_task_result))\n"
    )
    where, queries = run(python, "-c", probe, cwd=tmp_path).split()
    assert Path(where).is_relative_to(tmp_path / "app") and queries == "True"
