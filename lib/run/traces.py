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
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from lib.job import PendingJob

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


@contextmanager
def run_span(tracer: Any, queue: str, job: PendingJob) -> Iterator[Callable[[str, BaseException | None], None]]:
    """The job's run as the current span; what it yields records the outcome
    (the status the job reached and its error) before the span ends. A run
    the worker's own kill cuts short ends without one."""
    from opentelemetry.trace import SpanKind, Status, StatusCode

    attributes = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "process",
        "messaging.destination.name": queue,
        "messaging.message.id": str(job.id),
        "jobs.name": job.name,
        "jobs.attempt": job.attempts,
    }
    with tracer.start_as_current_span(
        f"process {queue}",
        kind=SpanKind.CONSUMER,
        links=_links(job.trace),
        attributes=attributes,
        # Only the outcome says whether the run failed: a kill at shutdown is not the job's error.
        record_exception=False,
        set_status_on_exception=False,
    ) as span:

        def ended(status: str, error: BaseException | None) -> None:
            span.set_attribute("jobs.outcome", status)
            if status.startswith("err: "):
                if error is not None:
                    span.record_exception(error)
                span.set_status(Status(StatusCode.ERROR, status))

        yield ended


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
