"""A worker process of the anthropic queue (queues/anthropic) against the
fake Messages API of tests/system/test_budget_processes.py (BUDGET_API_URL),
with budgets small enough for a test: 600 input and 200 output tokens every
2 s, 60 and 20 reserved a job, and a rate that does not bind."""

from gevent import monkey

monkey.patch_all()

import os  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import worker  # noqa: E402
from lib.clients import AnthropicClient  # noqa: E402
from lib.job import Budget, Rate  # noqa: E402
from lib.run.queue import Queue  # noqa: E402
from lib.store.db import DB  # noqa: E402
from queues import anthropic  # noqa: E402

BUDGETS = (Budget("tokens_in", 600, per=2, most=60), Budget("tokens_out", 200, per=2, most=20))


def registry() -> list[Callable[[DB], Queue]]:
    client = AnthropicClient("sk-test-budget", base_url=os.environ["BUDGET_API_URL"])
    # A short fallback poll, as in rate_worker.py: a poller that found the
    # budget spent by another process looks again soon.
    return [
        lambda db: anthropic.make_worker(
            db, client, rate=Rate(100, per=1, burst=10), budgets=BUDGETS, poll_interval=0.5
        )
    ]


if __name__ == "__main__":
    sys.exit(worker.main(registry(), []))
