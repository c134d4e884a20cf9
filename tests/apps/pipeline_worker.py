"""A worker process of a three-queue pipeline for the pipeline tests, each
queue on its real API client (base URLs and keys from the worker's settings:
APOLLO_*, ANTHROPIC_*, SLACK_*):

- enrich: Apollo's organization enrichment of the lead's domain, a step, then
  a summarise job with then();
- summarise: one Anthropic message about the organization, a step, then a
  post job with then();
- post: the summary posted to Slack by the slack queue's own handler
  (queues.slack.post_message), which marks the post begun in slack_posts
  before it sends it.

Every job has attempts enough for every kill; no queue is throttled, so the
test's few hundred leads go through in seconds. Tests SIGKILL it at random
moments and count what the fake APIs received."""

from gevent import monkey

monkey.patch_all()

import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import worker  # noqa: E402
from lib.clients import AnthropicClient, ApolloClient, SlackClient  # noqa: E402
from lib.job import PendingJob, status  # noqa: E402
from lib.run.api_queue import make_api_worker, throttle_for  # noqa: E402
from lib.run.queue import Queue  # noqa: E402
from lib.setup.settings import Settings  # noqa: E402
from lib.store.db import DB  # noqa: E402
from queues.slack import post_message  # noqa: E402

CHANNEL = "C0LEADS"
MODEL = "claude-sonnet-4-5"
# Each queue's definition: four slots, a fallback poll short enough for a
# restarted worker to find work at once, and attempts for every kill.
OPTIONS: dict[str, Any] = {"concurrency": 4, "poll_interval": 0.3, "max_attempts": 50}
UNTHROTTLED = throttle_for(None)


def domain(lead: int) -> str:
    return f"lead-{lead}.example"


def enrich(db: DB, client: ApolloClient, job: PendingJob) -> str:
    lead = job.args["lead"]
    # An enrichment can spend a credit: a later run of this job reads it back.
    found = job.step("organization", lambda: client.enrich_organization(domain(lead)))
    job.then("summarise", "summarise.Lead", {"lead": lead, "organization": found["organization"]["name"]})
    return status.ok()


def summarise(db: DB, client: AnthropicClient, job: PendingJob) -> str:
    lead, organization = job.args["lead"], job.args["organization"]
    prompt = f"Summarise lead {lead}, of {organization}, in one line."
    # A message is billed by the token: a later run of this job reads it back.
    answer = job.step(
        "summary",
        lambda: client.create_message(model=MODEL, max_tokens=200, messages=[{"role": "user", "content": prompt}]),
    )
    text = "".join(block["text"] for block in answer["content"] if block.get("type") == "text")
    job.then("post", "post.Send", {"lead": lead, "channel": CHANNEL, "text": f"lead {lead}: {text}"})
    return status.ok()


def registry(settings: Settings) -> list[Callable[[DB], Queue]]:
    """The three queues, each on its client, from the worker's settings. The
    post queue runs the slack queue's handler as it is: the post is marked
    begun before it is sent."""
    queues = (
        ("enrich", ApolloClient, {"enrich.Lead": enrich}, settings.apollo_api_key, settings.apollo_base_url),
        (
            "summarise",
            AnthropicClient,
            {"summarise.Lead": summarise},
            settings.anthropic_api_key,
            settings.anthropic_base_url,
        ),
        ("post", SlackClient, {"post.Send": post_message}, settings.slack_bot_token, settings.slack_base_url),
    )
    return [_api_queue(*queue) for queue in queues]


def _api_queue(
    name: str, client: Any, handlers: dict[str, Any], token: str | None, base_url: str
) -> Callable[[DB], Queue]:
    def make(db: DB) -> Queue:
        return make_api_worker(name, db, None, client, handlers, UNTHROTTLED, token=token, base_url=base_url, **OPTIONS)

    return make


if __name__ == "__main__":
    sys.exit(worker.main(registry))
