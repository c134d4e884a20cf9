"""A worker process that traces with OpenTelemetry's SDK, for the tracing
tests: a tracer provider set at import, as a program's queue module sets
one, its spans kept by the SDK's in-memory exporter and written to
SPANS_FILE, one JSON object a line, when the worker stops."""

from gevent import monkey

monkey.patch_all()

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

import worker  # noqa: E402
from lib.job import PendingJob  # noqa: E402
from lib.run.queue import Queue  # noqa: E402
from lib.store.db import DB  # noqa: E402

EXPORTER = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
trace.set_tracer_provider(provider)


def fine(job: PendingJob) -> str:
    # A span of the handler's own: a child of the run's.
    with trace.get_tracer("traced.handler").start_as_current_span("handler work"):
        return "ok"


def broken(job: PendingJob) -> str:
    raise ValueError(f"broken {job.args['n']}")


def then(job: PendingJob) -> str:
    # A follow-up: written with this run's outcome, after its span has ended.
    job.then("traced", "traced.Fine", {"n": 1000 + job.args["n"]})
    return "ok"


def make_traced(db: DB) -> Queue:
    return Queue("traced", {"traced.Fine": fine, "traced.Broken": broken, "traced.Then": then}, poll_interval=0.3)


def as_json(span) -> dict:  # type: ignore[no-untyped-def]
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": format(span.context.trace_id, "032x"),
        "span_id": format(span.context.span_id, "016x"),
        "parent": None if span.parent is None else format(span.parent.span_id, "016x"),
        "links": [[format(link.context.trace_id, "032x"), format(link.context.span_id, "016x")] for link in span.links],
        "attributes": dict(span.attributes),
        "status": span.status.status_code.name,
        "description": span.status.description,
        "events": [event.name for event in span.events],
    }


if __name__ == "__main__":
    code = worker.main([make_traced])
    with open(os.environ["SPANS_FILE"], "w") as out:
        for span in EXPORTER.get_finished_spans():
            out.write(json.dumps(as_json(span)) + "\n")
    sys.exit(code)
