"""A consumer span for each run, when the worker's program uses OpenTelemetry:
linked to the trace context its enqueuer stored (lib.insert.trace_context),
not parented by it, since a run may start hours after the request that
enqueued it ended. The handler runs inside the span, so the spans it makes
(an HTTP call, a query) are its children.

OpenTelemetry's API is read only where the program has loaded it and set a
tracer provider (as a queue module that configures tracing does): otherwise
tracer() is None and the executor calls nothing here. The claim and the
outcome's write make no span of their own."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from lib.job import PendingJob

log = logging.getLogger("jobs.traces")

# The span's names for what it is about: OpenTelemetry's messaging
# conventions where they have one, the worker's own for the rest.
SYSTEM = "jobs"


def tracer() -> Any | None:
    """The tracer runs' spans come from; None when the program has not loaded
    OpenTelemetry's API or has set no tracer provider."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    return provider.get_tracer("jobs.worker")


def start_run(tracer: Any, queue: str, job: PendingJob) -> Any | None:
    """The job's run's span, started; None when the program's tracing fails
    to start one (a span processor that raises): the job then runs untraced."""
    from opentelemetry.trace import SpanKind

    attributes = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "process",
        "messaging.destination.name": queue,
        "messaging.message.id": str(job.id),
        "jobs.name": job.name,
        "jobs.attempt": job.attempts,
    }
    try:
        return tracer.start_span(
            f"process {queue}", kind=SpanKind.CONSUMER, links=_links(job.trace), attributes=attributes
        )
    except Exception as exc:
        _tracing_failed(exc)
        return None


def current(span: Any) -> AbstractContextManager[Any]:
    """The span as the current one while the handler runs, so the spans it
    makes are its children. Only the outcome says whether the run failed: a
    kill at shutdown is not the job's error."""
    from opentelemetry.trace import use_span

    return use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False)


def end_run(span: Any, status: str | None, error: BaseException | None) -> None:
    """The run's outcome recorded on its span (status None: the worker's own
    kill cut the run short), and the span ended. A fault of the program's
    tracing here is said and goes no further: the outcome is the job's."""
    from opentelemetry.trace import Status, StatusCode

    try:
        if status is not None:
            span.set_attribute("jobs.outcome", status)
            if status.startswith("err: "):
                if error is not None:
                    span.record_exception(error)
                span.set_status(Status(StatusCode.ERROR, status))
        span.end()
    except Exception as exc:
        _tracing_failed(exc)


@contextmanager
def resumed(stored: str | None) -> Iterator[None]:
    """A run's trace context (lib.insert.trace_context, taken in its span)
    current again, so that what is enqueued now stores it: a follow-up,
    written after the run's span has ended, links to that run. Nothing to
    do when it stored none."""
    token = None
    if stored is not None:
        from opentelemetry import context, propagate

        try:
            token = context.attach(propagate.extract(json.loads(stored)))
        except Exception as exc:
            _tracing_failed(exc)
    try:
        yield
    finally:
        if token is not None:
            context.detach(token)


def _tracing_failed(exc: Exception) -> None:
    """Said once a process: a broken exporter would otherwise say it every job."""
    global _said_failed
    if not _said_failed:
        _said_failed = True
        log.warning("tracing failed, runs go on untraced where it does (said once): %s: %s", type(exc).__name__, exc)


_said_failed = False


def _links(stored: str | None) -> list[Any]:
    """A link to the enqueuer's span, from the context stored with the job;
    none when it stored none or what it stored names no span."""
    if stored is None:
        return []
    from opentelemetry import propagate, trace

    try:
        carrier = json.loads(stored)
        context = trace.get_current_span(propagate.extract(carrier)).get_span_context()
    except (ValueError, TypeError, AttributeError):
        return []
    return [trace.Link(context)] if context.is_valid else []
