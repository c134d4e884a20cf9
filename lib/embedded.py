"""A private Postgres for when no DATABASE_URL is given, so a newcomer needs
nothing installed but Python.

The server comes from the pgserver package (it bundles one); failing that,
from a PostgreSQL installed on the machine. Either listens only on a Unix
socket inside the data folder, so it never collides with another server.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import subprocess
import warnings
from pathlib import Path

from lib.sql import ROOT

log = logging.getLogger("jobs.embedded")

DEFAULT_DIR = ROOT / ".pgdata"


def database_url(data_dir: Path | None = None) -> str:
    """DATABASE_URL when set; else the URL of the embedded server, started if
    it is not running. JOBS_EMBEDDED=system skips pgserver."""
    url = os.environ.get("DATABASE_URL")
    if url:
        return url
    return start(data_dir or Path(os.environ.get("JOBS_DATA_DIR", DEFAULT_DIR)))


def start(data_dir: Path) -> str:
    data_dir = data_dir.resolve()
    if os.environ.get("JOBS_EMBEDDED") != "system":
        try:
            return _pgserver(data_dir / "pgserver")
        except ImportError:
            log.info("pgserver is not installed; looking for a PostgreSQL on this machine")
    return _system(data_dir / "system")


def _pgserver(data_dir: Path) -> str:
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset, as it is on servers.
        warnings.simplefilter("ignore")
        import pgserver

        # Its INFO lines narrate each start step; our own line says where it runs.
        logging.getLogger("pgserver").setLevel(logging.WARNING)
        data_dir.mkdir(parents=True, exist_ok=True)
        # Stopped when the last process that started it through pgserver exits.
        server = pgserver.get_server(data_dir, cleanup_mode="stop")
    url: str = server.get_uri()
    log.info("embedded Postgres (pgserver) in %s", data_dir)
    return url


def _bindir() -> Path | None:
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).resolve().parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(p.split("/")[4]))
    return Path(candidates[-1]).parent if candidates else None


def _system(data_dir: Path) -> str:
    """initdb and pg_ctl from a PostgreSQL on the machine. Postgres refuses to
    run as root, so as root it runs as the postgres user."""
    bindir = _bindir()
    if bindir is None:
        raise RuntimeError(
            "no Postgres to embed: install the requirements (pgserver), install PostgreSQL, or set DATABASE_URL"
        )
    prefix: list[str] = []
    data_dir.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        prefix = ["runuser", "-u", "postgres", "--"]
        shutil.chown(data_dir, "postgres", "postgres")
        data_dir.chmod(0o700)
    if not (data_dir / "PG_VERSION").exists():
        subprocess.run(
            [*prefix, str(bindir / "initdb"), "-D", str(data_dir), "-U", "postgres", "--auth=trust", "-E", "UTF8"],
            check=True,
            capture_output=True,
        )
    running = subprocess.run([*prefix, str(bindir / "pg_ctl"), "-D", str(data_dir), "status"], capture_output=True)
    if running.returncode != 0:
        subprocess.run(
            [
                *prefix,
                str(bindir / "pg_ctl"),
                "-D",
                str(data_dir),
                "-o",
                f"-h '' -k {data_dir}",
                "-l",
                str(data_dir / "log"),
                "-w",
                "start",
            ],
            check=True,
            capture_output=True,
        )
    log.info("embedded Postgres (%s) in %s", bindir, data_dir)
    return f"postgresql://postgres@/postgres?host={data_dir}"
