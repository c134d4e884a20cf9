"""The probe worker (probe_worker.py) with its admin page's penalty for a
wrong credential set to $ADMIN_PENALTY seconds: the page's own constant,
set before the worker builds the page, so a test of guessing against a real
process takes seconds, not minutes. The page is on with JOBS_ADMIN_TOKEN."""

from gevent import monkey

monkey.patch_all()

import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from probe_worker import make_probe  # noqa: E402

import worker  # noqa: E402
from lib.http.admin import guesses  # noqa: E402

if __name__ == "__main__":
    guesses.PENALTY = float(os.environ["ADMIN_PENALTY"])
    sys.exit(worker.main([make_probe]))
