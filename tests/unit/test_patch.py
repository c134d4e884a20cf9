"""The worker's patching of the standard library (lib/greenlets/patch.py):
all of gevent's, with its subscribers told, and no search for plugins."""

from tests_support import run_python

PATCH_THEN_REPORT = """
import sys

import gevent.events

told = []
gevent.events.subscribers.append(lambda event: told.append(type(event).__name__))

from lib.greenlets.patch import patch_stdlib

patch_stdlib()

import socket, threading, time

import gevent.monkey

print("patched:", all(gevent.monkey.is_module_patched(m) for m in ("socket", "threading", "time", "select", "ssl", "os")))
print("cooperative:", socket.socket.__module__, time.sleep.__module__)
print("told:", "GeventWillPatchAllEvent" in told, "GeventDidPatchAllEvent" in told)
print("metadata:", "importlib.metadata" in sys.modules)
"""


def test_the_stdlib_is_patched_and_subscribers_told_without_looking_up_plugins():
    done = run_python(PATCH_THEN_REPORT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "patched: True" in done.stdout, done.stdout
    assert "cooperative: gevent._socket3 gevent.hub" in done.stdout, done.stdout
    assert "told: True True" in done.stdout, done.stdout
    assert "metadata: False" in done.stdout, done.stdout
