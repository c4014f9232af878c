"""The error tree. Every failure the service reports to a caller is one of these.

Errors from libraries (SQLAlchemy, jsonschema, GitPython) are translated into these types where
they enter; the API maps the types to HTTP statuses in one table (``api/errors.py``), the CLI
prints their message.

    AgentAuthError                      code
    ├── ConfigError                     CONFIG_ERROR
    ├── ValidationError                 VALIDATION_ERROR     (carries every Problem)
    ├── PayloadTooLarge                 PAYLOAD_TOO_LARGE
    ├── AuthError
    │   ├── Unauthorized                UNAUTHORIZED
    │   └── ApiKeyExpired               API_KEY_EXPIRED
    ├── InsufficientScope               INSUFFICIENT_SCOPE
    ├── SelfApprovalForbidden           SELF_APPROVAL_FORBIDDEN
    ├── NotFound                        NOT_FOUND
    │   ├── AgentNotFound               AGENT_NOT_FOUND
    │   ├── PolicyNotFound              POLICY_NOT_FOUND
    │   ├── ApiKeyNotFound              API_KEY_NOT_FOUND
    │   ├── ApprovalNotFound            APPROVAL_NOT_FOUND
    │   └── WebhookNotFound             WEBHOOK_NOT_FOUND
    ├── ApprovalNotPending              APPROVAL_NOT_PENDING
    ├── MethodNotAllowed                METHOD_NOT_ALLOWED
    ├── RateLimited                     RATE_LIMITED         (carries retry_after seconds)
    └── StorageError                    INTERNAL_ERROR       (unreachable, unmigrated, write failed)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from schemas import Problem


class AgentAuthError(Exception):
    """Base of every error the service reports; ``code`` is the API's error code."""

    code: ClassVar[str] = "INTERNAL_ERROR"
    default_message: ClassVar[str] = "internal error"

    def __init__(self, message: str | None = None) -> None:
        self.message = message or self.default_message
        super().__init__(self.message)


class ConfigError(AgentAuthError):
    code = "CONFIG_ERROR"


class ValidationError(AgentAuthError):
    """Bad input; ``problems`` lists every problem found, not only the first."""

    code = "VALIDATION_ERROR"

    def __init__(self, problems: Iterable[Problem] | str) -> None:
        from schemas import Problem

        if isinstance(problems, str):
            problems = [Problem(None, None, "", problems)]
        self.problems = list(problems)
        summary = "; ".join(f"{p.path or 'body'}: {p.message}" for p in self.problems[:5])
        if len(self.problems) > 5:
            summary += f"; and {len(self.problems) - 5} more"
        super().__init__(summary or "invalid request")

    @classmethod
    def field(cls, path: str, message: str) -> ValidationError:
        from schemas import Problem

        return cls([Problem(None, None, path, message)])


class PayloadTooLarge(AgentAuthError):
    code = "PAYLOAD_TOO_LARGE"
    default_message = "request body is larger than the limit"


class AuthError(AgentAuthError):
    code = "UNAUTHORIZED"


class Unauthorized(AuthError):
    code = "UNAUTHORIZED"
    default_message = "missing, malformed, invalid or revoked API key"


class ApiKeyExpired(AuthError):
    code = "API_KEY_EXPIRED"
    default_message = "the API key has expired"


class InsufficientScope(AgentAuthError):
    code = "INSUFFICIENT_SCOPE"
    default_message = "the API key's scope does not permit this operation"


class SelfApprovalForbidden(AgentAuthError):
    code = "SELF_APPROVAL_FORBIDDEN"
    default_message = "a key that made the call an approval is for may not decide it"


class ApprovalNotPending(AgentAuthError):
    code = "APPROVAL_NOT_PENDING"
    default_message = "the approval is not pending (decided, used or expired)"


class NotFound(AgentAuthError):
    code = "NOT_FOUND"
    default_message = "not found"


class AgentNotFound(NotFound):
    code = "AGENT_NOT_FOUND"
    default_message = "agent not found"


class PolicyNotFound(NotFound):
    code = "POLICY_NOT_FOUND"
    default_message = "policy not found"


class ApiKeyNotFound(NotFound):
    code = "API_KEY_NOT_FOUND"
    default_message = "API key not found"


class ApprovalNotFound(NotFound):
    code = "APPROVAL_NOT_FOUND"
    default_message = "approval not found"


class WebhookNotFound(NotFound):
    code = "WEBHOOK_NOT_FOUND"
    default_message = "webhook not found"


class MethodNotAllowed(AgentAuthError):
    code = "METHOD_NOT_ALLOWED"
    default_message = "method not allowed"


class RateLimited(AgentAuthError):
    code = "RATE_LIMITED"

    def __init__(self, retry_after: int, message: str | None = None) -> None:
        self.retry_after = retry_after
        super().__init__(message or f"rate limit exceeded; retry in {retry_after} s")


class StorageError(AgentAuthError):
    code = "INTERNAL_ERROR"
    default_message = "the database could not complete the request"
