"""Reports made in native threads (lib/greenlets/reports.py): handed to the
hub's thread, so the reporting thread never enters sentry-sdk (whose locks,
queue and sender are the hub's) and never waits; each is sent from a greenlet
of its own, so one that hangs or fails holds no later report."""

from collections.abc import Callable, Iterator

import gevent
import gevent.monkey
import pytest
import sentry_sdk
from gevent._hub_local import get_hub_if_exists
from gevent.event import Event
from sentry_sdk.transport import Transport

from lib.greenlets import reports
from lib.setup import error_reports
from lib.setup.error_reports import Outage

_start_thread = gevent.monkey.get_original("_thread", "start_new_thread")
_native_lock = gevent.monkey.get_original("_thread", "allocate_lock")
_thread_ident = gevent.monkey.get_original("_thread", "get_ident")


class ThreadNotingTransport(Transport):
    """Keeps each event's exception message (or message) with the native
    thread it was given to the transport in. A message starting "hang" waits
    for `go_on`; one starting "fail" raises."""

    def __init__(self) -> None:
        super().__init__({})
        self.events: list[tuple[str, int]] = []
        self.go_on = Event()

    def capture_envelope(self, envelope) -> None:  # type: ignore[no-untyped-def]
        for item in envelope.items:
            if item.type == "event":
                self._take(item.payload.json)

    def _take(self, event: dict) -> None:
        values = event.get("exception", {}).get("values", [])
        text = values[0]["value"] if values else event.get("message", "")
        if text.startswith("hang"):
            self.go_on.wait()
        if text.startswith("fail"):
            raise OSError("the transport is down")
        self.events.append((text, _thread_ident()))


@pytest.fixture
def sent() -> Iterator[ThreadNotingTransport]:
    """sentry-sdk on a noting transport, and reports of native threads handed
    to this thread's hub, as worker.run has them."""
    transport = ThreadNotingTransport()
    error_reports.init("http://public@127.0.0.1:9/1", transport=transport)
    reports.send_from_hub()
    yield transport
    transport.go_on.set()
    error_reports.send_through(None)
    sentry_sdk.get_client().close()
    sentry_sdk.init()


def in_native_thread(report: Callable[[], None], timeout: float = 5.0) -> dict:
    """Run report in a native thread while this thread holds its hub (a
    native wait): it must return without the hub's help. What the thread saw."""
    seen: dict = {}
    done = _native_lock()
    done.acquire()

    def run() -> None:
        try:
            report()
            # Whether reporting gave this thread a hub of its own.
            seen["hub"] = get_hub_if_exists()
        finally:
            done.release()

    _start_thread(run, ())
    assert done.acquire(timeout=timeout), "the native thread's report waited on something"
    return seen


def wait_for_events(transport: ThreadNotingTransport, count: int) -> list[str]:
    with gevent.Timeout(5, AssertionError(f"events so far: {transport.events}")):
        while len(transport.events) < count:
            gevent.sleep(0.01)
    return [text for text, _ in transport.events]


def test_an_outage_met_in_a_native_thread_is_reported_once_from_the_hubs_thread(sent):
    outage = Outage("leases")

    def renewals_fail() -> None:
        for _ in range(3):
            outage.failed(OSError("renewal refused"))

    seen = in_native_thread(renewals_fail)
    assert seen["hub"] is None
    # Not sent in that thread: the hub has not run since.
    assert sent.events == []
    assert wait_for_events(sent, 1) == ["renewal refused"]
    assert sent.events[0][1] == _thread_ident()
    assert outage._failures == 3
    gevent.sleep(0.1)
    assert len(sent.events) == 1


def test_a_report_made_on_the_hub_is_sent_there_at_once(sent):
    error_reports.capture(RuntimeError("from a greenlet"))
    assert sent.events == [("from a greenlet", _thread_ident())]


def test_a_report_that_hangs_or_fails_holds_no_later_report(sent):
    def three_reports() -> None:
        error_reports.capture(RuntimeError("hangs: the transport stalls"))
        error_reports.capture(RuntimeError("fails: the transport is down"))
        error_reports.capture_message("after both, from the same thread")

    in_native_thread(three_reports)
    error_reports.capture(RuntimeError("after both, from a greenlet"))
    assert sorted(wait_for_events(sent, 2)) == ["after both, from a greenlet", "after both, from the same thread"]
    sent.go_on.set()
    assert wait_for_events(sent, 3)[-1] == "hangs: the transport stalls"


def test_reports_past_the_most_that_wait_for_a_held_hub_are_dropped(sent):
    def many() -> None:
        for n in range(reports.MOST_WAITING + 5):
            error_reports.capture(RuntimeError(f"report {n}"))

    in_native_thread(many)
    assert len(wait_for_events(sent, reports.MOST_WAITING)) == reports.MOST_WAITING
    gevent.sleep(0.1)
    assert len(sent.events) == reports.MOST_WAITING
