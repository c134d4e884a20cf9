"""A fault of the program's tracing (a span processor or exporter that
raises as a run's span starts or ends) never touches the job: it runs, its
outcome is stored as without tracing, the queue goes on, and the worker
says so once."""

import logging

import pytest
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from tests_support import make_poller

from lib.insert import insert
from lib.run import traces


class Raising(SpanProcessor):
    def __init__(self, where: str) -> None:
        self.where = where

    def on_start(self, span, parent_context=None) -> None:  # type: ignore[no-untyped-def]
        if self.where == "start":
            raise RuntimeError("collector down")

    def on_end(self, span) -> None:  # type: ignore[no-untyped-def]
        if self.where == "end":
            raise RuntimeError("collector down")


@pytest.mark.parametrize("where", ["start", "end"])
def test_a_span_that_cannot_start_or_end_leaves_the_jobs_as_without_tracing(db, where, caplog, monkeypatch):
    monkeypatch.setattr(traces, "_said_failed", False)  # said once a process: this test's process is the suite's
    provider = TracerProvider()
    provider.add_span_processor(Raising(where))
    ran = []
    poller = make_poller("t", db, {"t.N": lambda job: ran.append(job.id) or "ok"})
    poller.executor.tracer = provider.get_tracer("test")
    ids = [insert(db, "t", "t.N") for _ in range(3)]
    with caplog.at_level(logging.WARNING, logger="jobs"):
        assert [poller.work_once() for _ in ids] == ["ok", "ok", "ok"]
    assert ran == ids
    assert db.query("SELECT status FROM jobs ORDER BY id") == [("ok",)] * 3
    said = [r.getMessage() for r in caplog.records if "tracing" in r.getMessage()]
    assert len(said) == 1, said
    assert "collector down" in said[0]
