import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg2

from lib import embedded


def test_falls_back_to_a_postgres_found_on_the_machine(monkeypatch):
    """Without pgserver importable, the embedded server comes from the
    machine's PostgreSQL: initdb and pg_ctl start a private server on a socket
    in the data folder. JOBS_EMBEDDED=system takes the same path on purpose."""
    monkeypatch.delenv("JOBS_EMBEDDED", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    # None in sys.modules makes `import pgserver` raise ImportError, as on a
    # machine where it is not installed.
    monkeypatch.setitem(sys.modules, "pgserver", None)
    # Not under pytest's tmp_path: as root the server runs as postgres, which
    # must be able to reach the folder.
    base = Path(tempfile.mkdtemp(prefix="jobs-embedded-"))
    base.chmod(0o755)
    bindir = embedded._bindir()
    assert bindir is not None, "no PostgreSQL binaries on this machine"
    data_dir = base / "system"
    try:
        url = embedded.database_url(base)
        assert url == f"postgresql://postgres@/postgres?host={data_dir}"
        conn = psycopg2.connect(url)
        with conn.cursor() as cur:
            cur.execute("SHOW data_directory")
            assert cur.fetchone() == (str(data_dir),)
        conn.close()
        # A second start, asked for the machine's server by name, finds it
        # running and hands out the same URL.
        monkeypatch.setenv("JOBS_EMBEDDED", "system")
        assert embedded.database_url(base) == url
    finally:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run(
            [*prefix, str(bindir / "pg_ctl"), "-D", str(data_dir), "-m", "fast", "stop"], capture_output=True
        )
        shutil.rmtree(base, ignore_errors=True)
