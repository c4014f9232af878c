"""agentauth: ask the authorization service before an agent's tool runs.

::

    from agentauth import AuthzClient, Guard

    guard = Guard(AuthzClient("http://127.0.0.1:8080", api_key), agent_id)

    @guard.tool("payments.refund")
    def refund(order_id: str, amount: float) -> str: ...

See :mod:`agentauth.guard` for what happens when the service is unreachable or a call needs a
human's approval (``Guard(..., wait_for_approval=SECONDS)``), and
:mod:`agentauth.mcp` for guarding every tool of an MCP server in one call. This package depends
on httpx only (and on the ``mcp`` SDK for :mod:`agentauth.mcp`), never on the service's code.
"""

from agentauth.answers import Approval, Decision, PolicyWarning
from agentauth.client import AsyncAuthzClient, AuthzClient
from agentauth.errors import (
    AuthzError,
    BadRequestError,
    ForbiddenError,
    RateLimitError,
    ServiceUnavailableError,
    UnauthorizedError,
)
from agentauth.guard import Guard, denied_result

__all__ = [
    "Approval",
    "AsyncAuthzClient",
    "AuthzClient",
    "AuthzError",
    "BadRequestError",
    "Decision",
    "ForbiddenError",
    "Guard",
    "PolicyWarning",
    "RateLimitError",
    "ServiceUnavailableError",
    "UnauthorizedError",
    "denied_result",
]
