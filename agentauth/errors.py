"""The errors the client raises, translated once from HTTP and httpx where they enter.

::

    AuthzError                   code, status_code, message
    ├── UnauthorizedError        401 (UNAUTHORIZED, API_KEY_EXPIRED): a wrong or expired key
    ├── ForbiddenError           403: the key's scope does not permit the call
    ├── BadRequestError          other 4xx (400 VALIDATION_ERROR, 404 APPROVAL_NOT_FOUND, ...)
    ├── RateLimitError           429: the key's per-minute budget is spent; retry_after_ms
    └── ServiceUnavailableError  no usable answer: network error, time-out, 5xx, unreadable body

A denied (or escalated) decision is not an error: ``authorize`` returns it. Messages never carry
the API key.
The guard (:mod:`agentauth.guard`) decides what each error means for a tool call.
"""

from __future__ import annotations


class AuthzError(Exception):
    """Base of every client error. ``code`` is the service's error code (or the client's own,
    such as ``UNAVAILABLE``), ``status_code`` the HTTP status (None when there was no answer)."""

    def __init__(self, message: str, *, code: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status_code = status_code

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(code={self.code!r}, status_code={self.status_code!r}, "
            f"message={self.message!r})"
        )


class UnauthorizedError(AuthzError):
    """401: the API key is missing, malformed, unknown, revoked or expired."""


class ForbiddenError(AuthzError):
    """403: the key is valid but its scope does not permit the call."""


class BadRequestError(AuthzError):
    """A 4xx other than 401, 403 and 429: the service refused the request as written."""


class RateLimitError(AuthzError):
    """429: the key sent more requests this minute than the service allows.
    ``retry_after_ms`` comes from the ``Retry-After`` header (None when absent)."""

    def __init__(
        self, message: str, *, code: str, status_code: int | None, retry_after_ms: int | None
    ) -> None:
        super().__init__(message, code=code, status_code=status_code)
        self.retry_after_ms = retry_after_ms


class ServiceUnavailableError(AuthzError):
    """No usable answer: the service could not be reached, did not answer in time, failed
    (5xx), or answered something that is not a decision."""
