"""The anthropic queue: one Messages API call per job, its answer stored by key."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from lib import status
from lib.api_queue import make_api_worker, throttle_for
from lib.args import unmarshal_args
from lib.clients import AnthropicClient
from lib.db import DB
from lib.poller import PendingJob, Poller
from lib.sql import Q

# 50 requests a minute is the lowest usage tier's limit; a 429 still backs off
# to the reset the API names.
throttle = throttle_for(50)


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


def make_worker(db: DB, client: AnthropicClient | None = None, **options: Any) -> Poller:
    return make_api_worker("anthropic", db, client, AnthropicClient, {"anthropic.Ask": ask}, throttle, **options)
