"""HTTP clients for the third-party APIs the jobs call."""

from lib.clients.anthropic import AnthropicClient
from lib.clients.api_errors import (
    APIError,
    AuthError,
    BadInputError,
    InvalidArgument,
    NotConfigured,
    NotFoundError,
    OutcomeUnknown,
    OverloadedError,
    RateLimitError,
    ServerError,
)
from lib.clients.apollo import ApolloClient
from lib.clients.base import APIClient
from lib.clients.github import GitHubClient
from lib.clients.outcomes import Outcome
from lib.clients.slack import SlackClient

__all__ = [
    "APIClient",
    "APIError",
    "AnthropicClient",
    "ApolloClient",
    "AuthError",
    "BadInputError",
    "GitHubClient",
    "InvalidArgument",
    "NotConfigured",
    "NotFoundError",
    "Outcome",
    "OutcomeUnknown",
    "OverloadedError",
    "RateLimitError",
    "ServerError",
    "SlackClient",
]
