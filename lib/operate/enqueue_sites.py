"""The places in the code that enqueue (writers of job rows), as the registry
check reads them without running anything: where each is, and the queue and
job name it writes; and the files it reads them from. Not the run
pipeline's write stage (lib/run/steps.py), which writes a job's outcome."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Writer:
    where: str  # file:line relative to the root, or "schedule"
    queue: str
    name: str


def found(path: Path, suffix: str) -> list[Path]:
    """path itself when it is such a file; else the files of that kind under
    it, leaving out hidden folders (.venv, .git) and caches."""
    if path.is_file():
        return [path] if path.suffix == suffix else []
    return sorted(
        p
        for p in path.rglob(f"*{suffix}")
        if not any(
            part.startswith(".") or part in ("__pycache__", "site-packages") for part in p.relative_to(path).parts
        )
    )


def where_of(path: Path, root: Path) -> str:
    """A file as a problem names it: relative to the project, else as it is."""
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)
