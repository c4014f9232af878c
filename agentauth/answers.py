"""Reading an answer of ``POST /v1/authorize``: the :class:`Decision` in a 200, or the error of
:mod:`agentauth.errors` its status means. The contract with the service lives here; how the
request is sent and the answer received is :mod:`agentauth.client`'s.
"""

from __future__ import annotations

import email.utils
import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime
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

#: an answer longer than this is not a decision (a decision is a few hundred bytes)
MAX_ANSWER_BYTES = 64 * 1024
#: a reason longer than this is cut: it ends up in denial texts and logs
MAX_REASON_CHARS = 1000


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


def read_answer(status: int, headers: httpx.Headers, content: bytes, whole: bool) -> Decision:
    """The decision in an answer, or the error its status means. A body cut off (``whole``
    False: too long or too slow) still has its status counted; a 200's cut-off body is no
    decision."""
    if status == 200:
        if not whole:
            raise _unreadable(f"was cut off (over {MAX_ANSWER_BYTES} bytes, or too slow)")
        return _decision(content)
    code, message = _error_body(content)
    if status >= 500 or status == 408:
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
    if status < 400:  # another 2xx, or a redirect: base_url points somewhere else
        raise BadRequestError(
            f"HTTP {status} is not an answer of the authorization endpoint: check base_url",
            code="UNEXPECTED_STATUS",
            status_code=status,
        )
    raise BadRequestError(text, code=code or "BAD_REQUEST", status_code=status)


def _decision(content: bytes) -> Decision:
    """A 200's body as a Decision. ``allowed: false`` is a denial whatever else is wrong with
    the body; ``allowed: true`` counts only in a well-formed decision; anything else is an
    unusable answer."""
    body = _json(content)
    if not isinstance(body, dict):
        raise _unreadable("is not a JSON object")
    allowed = body.get("allowed")
    if type(allowed) is not bool:  # only a real boolean counts: not "true", not 1
        raise _unreadable("has no boolean 'allowed'")
    if not allowed:
        return Decision(
            allowed=False,
            outcome="denied",
            reason=_reason(body.get("reason")) or "denied by the authorization service",
            policy_id=_loose(body, "policyId", str),
            rule_index=_loose(body, "ruleIndex", int),
            audit_id=_loose(body, "auditId", str),
            latency_ms=_loose(body, "latencyMs", float),
            retry_after_seconds=_loose(body, "retryAfterSeconds", int),
        )
    outcome, reason = body.get("outcome"), _reason(body.get("reason"))
    if outcome != "allowed" or reason is None:
        raise _unreadable("allows without outcome 'allowed' and a reason")
    return Decision(
        allowed=True,
        outcome=outcome,
        reason=reason,
        policy_id=_optional(body, "policyId", str),
        rule_index=_optional(body, "ruleIndex", int),
        audit_id=_optional(body, "auditId", str),
        latency_ms=_optional(body, "latencyMs", float),
        retry_after_seconds=_optional(body, "retryAfterSeconds", int),
    )


def _json(content: bytes) -> Any:
    try:
        return json.loads(content)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, nested beyond the stack
        return None


def _reason(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    return value if len(value) <= MAX_REASON_CHARS else value[:MAX_REASON_CHARS] + "…"


def _loose(body: dict[str, Any], name: str, kind: type) -> Any:
    """A denial's optional field, or None when it is malformed."""
    try:
        return _optional(body, name, kind)
    except ServiceUnavailableError:
        return None


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
    body = _json(content)
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return None, None
    code, message = error.get("code"), error.get("message")
    return (
        code[:100] if isinstance(code, str) else None,
        message[:500] if isinstance(message, str) else None,
    )


def _retry_after_ms(value: str | None) -> int | None:
    """``Retry-After`` (seconds, or an HTTP date) as milliseconds from now."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - datetime.now(UTC)).total_seconds()
    if not math.isfinite(seconds):
        return None
    return max(0, math.ceil(seconds * 1000))
