"""Our side of bench/compare.py, working: the real worker.main, as a deployed
worker runs it, with trivial no-op queues built from the command line.

Only what any queue module uses: worker.main(registry, argv) with a registry
of queue constructors, so the benchmark measures whatever the worker's internals
are at the time. The handler notes its start (bench/apps/compare_support.py);
the notes are written when the worker exits (SIGTERM). The benchmark sets
DATABASE_URL, JOBS_HTTP_ADDR=off and LOG_LEVEL=WARNING in its environment.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from lib.greenlets.patch import patch_stdlib

patch_stdlib()  # first, as in worker.py: every later import sees the cooperative stdlib

from collections.abc import Callable  # noqa: E402

from compare_support import OURS_JOB_NAME as JOB_NAME  # noqa: E402
from compare_support import Starts, worker_parser  # noqa: E402

import worker  # noqa: E402
from lib.job import PendingJob  # noqa: E402
from lib.run.queue import Queue  # noqa: E402
from lib.store.db import DB  # noqa: E402


def registry(queues: list[str], concurrency: int, starts: Starts) -> list[Callable[[DB], Queue]]:
    def noop(job: PendingJob) -> str:
        starts.started(int(job.args["seq"]))
        return "ok"

    # Every other Queue option at its default: the fallback poll (LISTEN/NOTIFY
    # wakes the pollers), the lease, the throttle (none).
    return [lambda db, q=q: Queue(q, {JOB_NAME: noop}, concurrency=concurrency) for q in queues]


def main() -> int:
    args = worker_parser(__doc__).parse_args()
    starts = Starts(args.target, args.done_file, args.starts_file)
    try:
        # argv=[]: run, as `python worker.py` does; DATABASE_URL names the database.
        return worker.main(registry(args.queues.split(","), args.concurrency, starts), [])
    finally:
        starts.dump()


if __name__ == "__main__":
    sys.exit(main())
