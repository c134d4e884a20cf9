"""A worker process of the test Django site's queue (tests/apps/django_site):
its tasks run as jobs of queue "default", a job's one attempt each.
DJANGO_DB_DRIVER=psycopg2 keeps the tasks' Django connections on psycopg2."""

from gevent import monkey

monkey.patch_all()

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

SITE = Path(__file__).resolve().parent / "django_site"
sys.path[:0] = [str(SITE.parents[2]), str(SITE)]

import worker  # noqa: E402
from lib.adapters.django_worker import django_queue  # noqa: E402
from lib.run.queue import Queue  # noqa: E402
from lib.store.db import DB  # noqa: E402


def make_shop(db: DB) -> Queue:
    return django_queue("default", settings="djsite.settings", modules=["shop.tasks"], concurrency=2, poll_interval=0.3)


if __name__ == "__main__":
    sys.exit(worker.main([make_shop]))
