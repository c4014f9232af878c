"""The HTTP clients of ``POST /v1/authorize``: :class:`AuthzClient` (blocking) and
:class:`AsyncAuthzClient` (asyncio), both on httpx with real time-outs. They share everything
but the sending: the request is built by :func:`_request_body`, and every answer goes through
:func:`_read_answer`, which returns a :class:`Decision` or raises one of :mod:`agentauth.errors`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import httpx

from agentauth.errors import (
    AuthzError,
    BadRequestError,
    ForbiddenError,
    RateLimitError,
    ServiceUnavailableError,
    UnauthorizedError,
)
from agentauth.params import to_json

#: seconds for connecting, sending and reading each; an authorization check sits in front of
#: every tool call, so a stuck service must not hang the agent for long
DEFAULT_TIMEOUT = 5.0
AUTHORIZE_PATH = "/v1/authorize"


@dataclass(frozen=True)
class Decision:
    """What the service decided for one call (decisions §3), or what a guard decided in its
    place when the service gave no usable answer (then ``error`` says why and ``audit_id`` is
    None). ``allowed`` is True only for a real ``true`` from the service, or a guard's
    ``on_error="allow"``."""

    allowed: bool
    outcome: str
    reason: str
    policy_id: str | None = None
    rule_index: int | None = None
    audit_id: str | None = None
    latency_ms: float | None = None
    retry_after_seconds: int | None = None
    #: the error a guard decided on instead of the service (None: the service decided)
    error: AuthzError | None = None


class AuthzClient:
    """A blocking client: ``AuthzClient(base_url, api_key).authorize(agent, tool, params)``.

    One connection pool per client: create it once and share it (it is thread-safe); close it
    with :meth:`close` or a ``with`` block. ``timeout`` is seconds per phase (connect, write,
    read, pool) or an ``httpx.Timeout``.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = _base_url(base_url)
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=_headers(api_key),
            timeout=timeout,
            transport=transport,
            follow_redirects=False,
        )

    def authorize(
        self, agent_id: str, tool_name: str, parameters: Mapping[str, Any] | None = None
    ) -> Decision:
        """May ``agent_id`` call ``tool_name`` with ``parameters``? A denial is a Decision,
        not an error; errors are raised as :mod:`agentauth.errors` says."""
        body = _request_body(agent_id, tool_name, parameters)
        try:
            response = self._http.post(AUTHORIZE_PATH, content=body)
        except httpx.HTTPError as exc:
            raise _unreachable(exc, self.base_url) from None
        return _read_answer(response.status_code, response.headers, response.content)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> AuthzClient:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"AuthzClient(base_url={self.base_url!r})"


class AsyncAuthzClient:
    """The asyncio twin of :class:`AuthzClient`: ``await client.authorize(...)``; close with
    :meth:`aclose` or ``async with``."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = _base_url(base_url)
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=_headers(api_key),
            timeout=timeout,
            transport=transport,
            follow_redirects=False,
        )

    async def authorize(
        self, agent_id: str, tool_name: str, parameters: Mapping[str, Any] | None = None
    ) -> Decision:
        """See :meth:`AuthzClient.authorize`."""
        body = _request_body(agent_id, tool_name, parameters)
        try:
            response = await self._http.post(AUTHORIZE_PATH, content=body)
        except httpx.HTTPError as exc:
            raise _unreachable(exc, self.base_url) from None
        return _read_answer(response.status_code, response.headers, response.content)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncAuthzClient:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"AsyncAuthzClient(base_url={self.base_url!r})"


# ------------------------------------------------------------------------ shared by both


def _base_url(base_url: str) -> str:
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        raise ValueError("base_url must be an http:// or https:// URL")
    return base_url.rstrip("/")


def _headers(api_key: str) -> dict[str, str]:
    # the key itself is never echoed, here or anywhere else
    if not isinstance(api_key, str) or not api_key or not api_key.isprintable():
        raise ValueError("api_key must be a non-empty string of printable characters")
    return {
        "Authorization": f"Bearer {api_key}",
        "Content-Type": "application/json",
        "Accept": "application/json",
        "User-Agent": "agentauth-python",
    }


def _request_body(agent_id: str, tool_name: str, parameters: Mapping[str, Any] | None) -> bytes:
    if not isinstance(agent_id, str):
        raise TypeError("agent_id must be a string (the agent's id)")
    if not isinstance(tool_name, str):
        raise TypeError("tool_name must be a string")
    if parameters is None:
        parameters = {}
    if not isinstance(parameters, Mapping):
        raise TypeError("parameters must be a mapping of parameter names to values")
    payload = {"agent_id": agent_id, "tool_name": tool_name, "parameters": to_json(parameters)}
    return json.dumps(payload, allow_nan=False, separators=(",", ":")).encode()


def _unreachable(exc: httpx.HTTPError, base_url: str) -> ServiceUnavailableError:
    if isinstance(exc, httpx.TimeoutException):
        message = f"no answer from {base_url} in time ({type(exc).__name__})"
    else:
        message = f"cannot reach {base_url} ({type(exc).__name__})"
    return ServiceUnavailableError(message, code="UNAVAILABLE")


def _read_answer(status: int, headers: httpx.Headers, content: bytes) -> Decision:
    if status == 200:
        return _decision(content)
    code, message = _error_body(content)
    if status >= 500 or status < 400:
        raise ServiceUnavailableError(
            f"HTTP {status} from the service: {message or 'no message'}",
            code=code or "UNAVAILABLE",
            status_code=status,
        )
    text = message or f"HTTP {status}"
    if status == 401:
        raise UnauthorizedError(text, code=code or "UNAUTHORIZED", status_code=status)
    if status == 403:
        raise ForbiddenError(text, code=code or "INSUFFICIENT_SCOPE", status_code=status)
    if status == 429:
        raise RateLimitError(
            text,
            code=code or "RATE_LIMITED",
            status_code=status,
            retry_after_ms=_retry_after_ms(headers.get("Retry-After")),
        )
    raise BadRequestError(text, code=code or "BAD_REQUEST", status_code=status)


def _decision(content: bytes) -> Decision:
    """A 200's body as a Decision; anything that is not one is an unusable answer."""
    try:
        body = json.loads(content)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise _unreadable("is not a JSON object")
    allowed = body.get("allowed")
    if type(allowed) is not bool:  # only a real boolean counts: not "true", not 1
        raise _unreadable("has no boolean 'allowed'")
    outcome, reason = body.get("outcome"), body.get("reason")
    if not isinstance(outcome, str) or not isinstance(reason, str):
        raise _unreadable("has no 'outcome' or 'reason' text")
    if allowed != (outcome == "allowed"):
        raise _unreadable("says 'allowed' and 'outcome' that disagree")
    return Decision(
        allowed=allowed,
        outcome=outcome,
        reason=reason,
        policy_id=_optional(body, "policyId", str),
        rule_index=_optional(body, "ruleIndex", int),
        audit_id=_optional(body, "auditId", str),
        latency_ms=_optional(body, "latencyMs", float),
        retry_after_seconds=_optional(body, "retryAfterSeconds", int),
    )


def _optional(body: dict[str, Any], name: str, kind: type) -> Any:
    value = body.get(name)
    if value is None:
        return None
    if kind is float and type(value) in (int, float):
        return float(value)
    if type(value) is not kind:
        raise _unreadable(f"has a '{name}' of the wrong type")
    return value


def _unreadable(what: str) -> ServiceUnavailableError:
    return ServiceUnavailableError(
        f"the service's answer {what}", code="BAD_RESPONSE", status_code=200
    )


def _error_body(content: bytes) -> tuple[str | None, str | None]:
    """``{"error": {"code", "message"}}`` when the body is one, else (None, None)."""
    try:
        error = json.loads(content).get("error")
        code, message = error.get("code"), error.get("message")
    except (ValueError, AttributeError):
        return None, None
    return (
        code if isinstance(code, str) else None,
        message[:500] if isinstance(message, str) else None,
    )


def _retry_after_ms(value: str | None) -> int | None:
    """``Retry-After`` in seconds (the service sends an integer) as milliseconds."""
    try:
        seconds = float(value) if value is not None else math.nan
    except ValueError:
        return None
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return math.ceil(seconds * 1000)
