"""The hub watch (lib/greenlets/hub_watch.py) watches the worker's hub alone:
a native thread that once ran a hub of its own (a gevent lock waited on
there) and left it unrun is no blocked hub, and gets no monitor thread."""

from tests_support import run_python

WATCH_THEN_LEAVE_A_HUB_UNRUN = """
from gevent import monkey

monkey.patch_all()

import logging
import sys

import gevent

from lib.greenlets import hub_watch

logging.basicConfig(stream=sys.stdout, format="%(message)s")
native_sleep = monkey.get_original("time", "sleep")
start_thread = monkey.get_original("_thread", "start_new_thread")
hubs = []


def thread_with_a_hub():
    gevent.sleep(0.01)  # runs this thread's own hub once
    hubs.append(gevent.get_hub())
    native_sleep(1.0)  # and leaves it unrun, as the lease renewal does


def hold_the_worker_hub():
    native_sleep(0.5)


hub_watch.watch(0.1)
start_thread(thread_with_a_hub, ())
gevent.sleep(1.2)
hold_the_worker_hub()
gevent.sleep(0.3)
print("other hub monitored:", hubs[0].periodic_monitoring_thread is not None)
print("threads:", next(l.split()[1] for l in open("/proc/self/status") if l.startswith("Threads:")))
"""


def test_only_the_worker_hub_is_watched():
    done = run_python(WATCH_THEN_LEAVE_A_HUB_UNRUN)
    assert done.returncode == 0, done.stderr[-3000:]
    held = [line for line in done.stdout.splitlines() if "hub has been held" in line]
    # The worker's own hub, held, is still told.
    assert len(held) >= 1 and all("hold_the_worker_hub" in line for line in held), done.stdout
    assert "other hub monitored: False" in done.stdout, done.stdout
    # This thread and the one monitor: the other thread has ended.
    assert "threads: 2" in done.stdout, done.stdout
