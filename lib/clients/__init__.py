"""HTTP clients for the third-party APIs the jobs call."""

from lib.clients.anthropic import AnthropicClient
from lib.clients.apollo import ApolloClient
from lib.clients.base import (
    APIClient,
    APIError,
    AuthError,
    InvalidArgument,
    NotConfigured,
    NotFoundError,
    OverloadedError,
    RateLimitError,
    ServerError,
)
from lib.clients.github import GitHubClient
from lib.clients.slack import SlackClient

__all__ = [
    "APIClient",
    "APIError",
    "AnthropicClient",
    "ApolloClient",
    "AuthError",
    "GitHubClient",
    "InvalidArgument",
    "NotConfigured",
    "NotFoundError",
    "OverloadedError",
    "RateLimitError",
    "ServerError",
    "SlackClient",
]
