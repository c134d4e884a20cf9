"""The anthropic queue: one Messages API call per job, its answer stored by key."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from lib.clients import AnthropicClient
from lib.clients.anthropic import READ_TIMEOUT
from lib.job import Budget, PendingJob, Rate, status
from lib.job.args import unmarshal_args
from lib.run.api_queue import make_api_worker, throttle_for
from lib.run.queue import Queue
from lib.store.db import DB
from lib.store.sql import Q

# A queue's own default (lib/run/queue.py), which a job_timeout option replaces.
DEFAULT_JOB_TIMEOUT = 600.0
# The lowest usage tier's limits for a Sonnet model, across every process
# that runs the queue: 50 requests, 30,000 input tokens and 8,000 output
# tokens a minute (a higher tier passes its own rate and budgets to
# make_worker). A claim reserves a prompt's worth of input tokens
# (MOST_TOKENS_IN, about 16,000 characters of English) and a default
# answer's max_tokens of output; each job reports what it spent from the
# answer's usage. A job past either can overdraw its budget by the
# difference, and the log says so; a 429 still holds the queue until the
# reset the API names.
MOST_TOKENS_IN = 4_000
RATE = Rate(50, per=60, burst=5)
BUDGETS = (
    Budget("tokens_in", 30_000, per=60, most=MOST_TOKENS_IN),
    Budget("tokens_out", 8_000, per=60, most=1_024),
)
throttle = throttle_for(None)


@dataclass
class AskArgs:
    key: str
    prompt: str
    model: str = "claude-sonnet-4-5"
    max_tokens: int = 1024
    system: str | None = None


def ask(db: DB, client: AnthropicClient, job: PendingJob) -> str:
    args = unmarshal_args(AskArgs, job.args)
    answer = client.create_message(
        model=args.model,
        max_tokens=args.max_tokens,
        messages=[{"role": "user", "content": args.prompt}],
        system=args.system,
    )
    usage = answer.get("usage") or {}
    # Input tokens written to the prompt cache count against the input limit; those read from it do not.
    job.spent(
        tokens_in=_count(usage, "input_tokens") + _count(usage, "cache_creation_input_tokens"),
        tokens_out=_count(usage, "output_tokens"),
    )
    text = "".join(block.get("text", "") for block in answer.get("content", []) if block.get("type") == "text")
    if not text:
        return status.fail(f"no text in the answer (stop_reason {answer.get('stop_reason')})")
    db.exec(
        Q.anthropic_answer_upsert,
        {
            "key": args.key,
            "model": answer.get("model", args.model),
            "prompt": args.prompt,
            "answer": text,
            "usage": json.dumps(answer.get("usage")),
        },
    )
    return status.ok(args.key)


def _count(usage: Any, field: str) -> int:
    """A count of the answer's usage, 0 when it is missing or not a count."""
    value = usage.get(field) if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def make_worker(db: DB, client: AnthropicClient | None = None, **options: Any) -> Queue:
    """The anthropic queue. Outcomes are lib.clients.anthropic.OUTCOMES:

    ===============================  ==========  ===============================
    answer                           outcome     the job
    ===============================  ==========  ===============================
    400 invalid_request_error        bad_input   fail:, not reported, not retried
    401 authentication_error         bad_token   queue paused 1 h, one report
    403 permission_error             bad_token   queue paused 1 h, one report
    404 not_found_error              bad_input   fail:
    413 request_too_large            bad_input   fail:
    429 rate_limit_error             rate_limit  back at the reset, queue held
    500 api_error                    transient   retried with backoff, counted
    504 timeout_error                transient   retried with backoff, counted
    529 overloaded_error             rate_limit  back after retry-after or 60 s
    connect refused or timed out     transient   retried (nothing was sent)
    sent, no answer (read timeout)   fault       err: OutcomeUnknown, reported
    ===============================  ==========  ===============================

    A limit met again waits at least twice as long as the last time; a job
    limited after 30 minutes of such waits ends, err (lib.run.api_queue).
    Timeouts: 5 s to connect; a read waits as long as a long generation
    takes, up to the SDK's 600 s, and never past the job's timeout.
    """
    options = {"rate": RATE, "budgets": BUDGETS, **options}
    job_timeout = float(options.get("job_timeout", DEFAULT_JOB_TIMEOUT))
    client_options = {"timeout": (5.0, min(READ_TIMEOUT, job_timeout))}
    return make_api_worker(
        "anthropic",
        db,
        client,
        AnthropicClient,
        {"anthropic.Ask": ask},
        throttle,
        client_options=client_options,
        **options,
    )
