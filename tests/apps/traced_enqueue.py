"""A web request's process, as the tracing tests need one: OpenTelemetry's
SDK configured, one request span (SERVER) inside which it enqueues a job of
each kind named on its command line with lib.insert, plus one insert_many,
and one more job enqueued outside any span. Prints the request span's ids and
the jobs' ids as JSON."""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import psycopg2
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind

from lib.insert import Job, insert, insert_many

trace.set_tracer_provider(TracerProvider())
conn = psycopg2.connect(os.environ["DATABASE_URL"])
with conn, conn.cursor() as cur:
    with trace.get_tracer("traced.web").start_as_current_span("POST /orders", kind=SpanKind.SERVER) as span:
        traced = [insert(cur, "traced", name, {"n": n}) for n, name in enumerate(sys.argv[1:])]
        many = insert_many(cur, [Job("traced", "traced.Fine", {"n": 100})])
    untraced = insert(cur, "traced", "traced.Fine", {"n": 200})
conn.close()
context = span.get_span_context()
print(
    json.dumps(
        {
            "trace_id": format(context.trace_id, "032x"),
            "span_id": format(context.span_id, "016x"),
            "traced": traced + many,
            "untraced": untraced,
        }
    )
)
