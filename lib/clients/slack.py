"""Slack Web API client (slack.com/api).

Slack reports failures as HTTP 200 with ``{"ok": false, "error": "<code>"}``;
``OUTCOMES`` says what each code documented for chat.postMessage (and the
Web API's common errors) means to a job, and ``_classify`` raises from it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lib.clients.api_errors import APIError, ServerError
from lib.clients.base import APIClient
from lib.clients.outcomes import IDEMPOTENT_METHODS, Outcome

if TYPE_CHECKING:
    import requests

# Every code chat.postMessage documents, and the common ones it can answer.
OUTCOMES: dict[str, Outcome] = {
    "ratelimited": Outcome.RATE_LIMIT,
    "rate_limited": Outcome.RATE_LIMIT,
    "invalid_auth": Outcome.BAD_TOKEN,
    "not_authed": Outcome.BAD_TOKEN,
    "account_inactive": Outcome.BAD_TOKEN,
    "token_revoked": Outcome.BAD_TOKEN,
    "token_expired": Outcome.BAD_TOKEN,
    # The token lacks chat:write: no job can post until a person changes its scopes.
    "missing_scope": Outcome.BAD_TOKEN,
    # Administrators suspended posting for the whole workspace.
    "ekm_access_denied": Outcome.BAD_TOKEN,
    "channel_not_found": Outcome.BAD_INPUT,
    "not_in_channel": Outcome.BAD_INPUT,
    "is_archived": Outcome.BAD_INPUT,
    "msg_too_long": Outcome.BAD_INPUT,
    "no_text": Outcome.BAD_INPUT,
    "invalid_blocks": Outcome.BAD_INPUT,
    "too_many_attachments": Outcome.BAD_INPUT,
    "restricted_action": Outcome.BAD_INPUT,
    "restricted_action_read_only_channel": Outcome.BAD_INPUT,
    "restricted_action_thread_only_channel": Outcome.BAD_INPUT,
    "restricted_action_non_threadable_channel": Outcome.BAD_INPUT,
    "no_permission": Outcome.BAD_INPUT,
    "invalid_arguments": Outcome.BAD_INPUT,
    # On a post, these two end the job OutcomeUnknown: see MAY_HAVE_TAKEN_EFFECT.
    "internal_error": Outcome.TRANSIENT,
    "fatal_error": Outcome.TRANSIENT,
    "service_unavailable": Outcome.TRANSIENT,
    "request_timeout": Outcome.TRANSIENT,
    "team_added_to_org": Outcome.TRANSIENT,
    "org_login_required": Outcome.TRANSIENT,
    # Codes about the request's encoding are this client's own bug: a fault.
    "invalid_arg_name": Outcome.FAULT,
    "invalid_charset": Outcome.FAULT,
    "invalid_form_data": Outcome.FAULT,
    "invalid_post_type": Outcome.FAULT,
    "missing_post_type": Outcome.FAULT,
    "missing_charset": Outcome.FAULT,
    "as_user_not_supported": Outcome.FAULT,
}
# Transient codes Slack documents as "It's possible some aspect of the
# operation succeeded before the error was raised": a message may be posted.
MAY_HAVE_TAKEN_EFFECT = frozenset({"internal_error", "fatal_error"})


class SlackCodeError(ServerError):
    """A transient code in an ok-false answer. Slack answered, and (but for
    MAY_HAVE_TAKEN_EFFECT) says the call was not carried out."""


def outcome_of(code: str) -> Outcome:
    """The table's outcome for code; a code it does not know is a fault."""
    return OUTCOMES.get(code, Outcome.FAULT)


class SlackClient(APIClient):
    """Slack Web API, authenticated with a bot token (xoxb-...); what each
    ok-false code means is OUTCOMES, any other status the base table.
    Timeouts: 5 s to connect, 30 s to read."""

    TOKEN_ENV = "SLACK_BOT_TOKEN"
    BASE_URL = "https://slack.com/api"
    BASE_URL_ENV = "SLACK_BASE_URL"

    def post_message(self, channel: str, text: str) -> dict[str, Any]:
        return self._request("POST", "/chat.postMessage", json={"channel": channel, "text": text})

    def _headers(self) -> dict[str, str]:
        return {
            **super()._headers(),
            "Authorization": f"Bearer {self._token}",
            # Slack flags JSON posts that omit the charset (missing_charset).
            "Content-Type": "application/json; charset=utf-8",
        }

    def _classify(self, response: requests.Response, body: Any, method: str, path: str) -> APIError | None:
        status = response.status_code
        if not 200 <= status < 300:
            return super()._classify(response, body, method, path)
        if not isinstance(body, dict):
            return None  # _request reports the missing JSON body itself.
        if body.get("ok") is True:
            return None
        code = body.get("error")
        if not isinstance(code, str) or not code:
            return APIError(status, method, path, "ok is not true and no error code given")
        return self._code_error(outcome_of(code), response, method, path, code)

    def _code_error(self, outcome: Outcome, response: requests.Response, method: str, path: str, code: str) -> APIError:
        if outcome is Outcome.TRANSIENT:
            return SlackCodeError(response.status_code, method, path, code)
        return self._error_of(outcome, response, method, path, code)

    def outcome(self, exc: BaseException) -> Outcome | None:
        # Slack said the call was not carried out: a post may go again.
        if isinstance(exc, SlackCodeError):
            return Outcome.TRANSIENT
        return super().outcome(exc)

    def answered_unknown(self, exc: BaseException) -> bool:
        if isinstance(exc, SlackCodeError):
            return exc.message in MAY_HAVE_TAKEN_EFFECT and exc.method not in IDEMPOTENT_METHODS
        # An HTTP 5xx on a post: Slack says nothing of whether it posted.
        return super().answered_unknown(exc)
