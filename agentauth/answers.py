"""Reading the service's answers: the :class:`Decision` in a 200 of ``POST /v1/authorize``, the
:class:`Approval` in a 200 of ``GET /v1/approvals/<id>``, or the error of :mod:`agentauth.errors`
another status means. The contract with the service lives here; how the request is sent and the
answer received is :mod:`agentauth.client`'s. Just over 300 lines, as one contract should be.
"""

from __future__ import annotations

import email.utils
import json
import math
import re
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
#: what an approval id may look like (the service's are UUIDs): it goes into a URL path and
#: into denial texts, so nothing else is taken from an answer or sent
APPROVAL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
#: what an approval's status may look like (pending, approved, denied, expired, used)
_STATUS = re.compile(r"[a-z_]{1,32}")
#: the most warnings taken from one answer (the service sends at most one)
MAX_WARNINGS = 8
_WOULD_BE = frozenset({"allowed", "denied", "escalated"})


@dataclass(frozen=True)
class PolicyWarning:
    """A ``warn`` policy's would-be decision that differs from the real one (decisions §10):
    the policy, what it would have decided (``allowed``, ``denied`` or ``escalated``) and
    why. A guard logs it and follows the real decision."""

    policy_id: str
    result: str
    reason: str


@dataclass(frozen=True)
class Decision:
    """What the service decided for one call (decisions §3), or what a guard decided in its
    place when the service gave no usable answer (then ``error`` says why and ``audit_id`` is
    None). ``allowed`` is True only for a real ``true`` from the service, or a guard's
    ``on_error="allow"``.

    ``outcome`` is ``"allowed"``, ``"denied"`` or ``"escalated"`` (the call waits for a human:
    ``allowed`` is False, ``approval_id`` names the approval and ``approval_expires_at`` says
    until when, an aware UTC datetime; decisions §6). ``approval_id`` also names the approval
    an allow used or a denial was caused by; None when no approval is involved."""

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
    approval_id: str | None = None
    approval_expires_at: datetime | None = None
    #: the session the call named, as the service recorded it (None when it named none)
    session_id: str | None = None
    #: what warn policies would have decided otherwise (decisions §10); never the decision
    warnings: tuple[PolicyWarning, ...] = ()


@dataclass(frozen=True)
class Approval:
    """What ``GET /v1/approvals/<id>`` says of one approval (decisions §6). ``status`` is the
    service's: ``pending``, ``approved``, ``denied``, ``expired`` or ``used`` (a pending or
    approved one past ``expires_at`` reads ``expired``). The other fields are None when the
    answer lacks them or has them malformed; ``comment`` is cut like a reason."""

    id: str
    status: str
    agent_id: str | None = None
    tool_name: str | None = None
    expires_at: datetime | None = None
    decided_at: datetime | None = None
    comment: str | None = None

    @property
    def pending(self) -> bool:
        """Still waiting for a human: neither decided nor expired nor used."""
        return self.status == "pending"


def read_answer(status: int, headers: httpx.Headers, content: bytes, whole: bool) -> Decision:
    """The decision in an answer, or the error its status means. A body cut off (``whole``
    False: too long or too slow) still has its status counted; a 200's cut-off body is no
    decision."""
    if status != 200:
        raise _status_error(status, headers, content, "the authorization endpoint")
    if not whole:
        raise _unreadable(f"was cut off (over {MAX_ANSWER_BYTES} bytes, or too slow)")
    return _decision(content)


def read_approval(
    status: int, headers: httpx.Headers, content: bytes, whole: bool, approval_id: str
) -> Approval:
    """The approval in an answer of ``GET /v1/approvals/<approval_id>``, or the error its
    status means (an unknown id: :class:`BadRequestError` ``APPROVAL_NOT_FOUND``, 404). A 200
    counts only with a ``status`` string; everything else in it is optional."""
    if status != 200:
        raise _status_error(status, headers, content, "the approvals endpoint")
    if not whole:
        raise _unreadable(f"was cut off (over {MAX_ANSWER_BYTES} bytes, or too slow)")
    body = _json(content)
    if not isinstance(body, dict):
        raise _unreadable("is not a JSON object")
    state = body.get("status")
    if not isinstance(state, str) or not _STATUS.fullmatch(state):
        raise _unreadable("has no approval 'status'")
    comment = _reason(body.get("comment"))
    return Approval(
        id=approval_id,
        status=state,
        agent_id=_loose(body, "agentId", str),
        tool_name=_loose(body, "toolName", str),
        expires_at=_loose_instant(body, "expiresAt"),
        decided_at=_loose_instant(body, "decidedAt"),
        comment=comment,
    )


def _status_error(status: int, headers: httpx.Headers, content: bytes, endpoint: str) -> AuthzError:
    """The error an answer other than 200 means."""
    code, message = _error_body(content)
    if status >= 500 or status == 408:
        return ServiceUnavailableError(
            f"HTTP {status} from the service: {message or 'no message'}",
            code=code or "UNAVAILABLE",
            status_code=status,
        )
    text = message or f"HTTP {status}"
    if status == 401:
        return UnauthorizedError(text, code=code or "UNAUTHORIZED", status_code=status)
    if status == 403:
        return ForbiddenError(text, code=code or "INSUFFICIENT_SCOPE", status_code=status)
    if status == 429:
        return RateLimitError(
            text,
            code=code or "RATE_LIMITED",
            status_code=status,
            retry_after_ms=_retry_after_ms(headers.get("Retry-After")),
        )
    if status < 400:  # another 2xx, or a redirect: base_url points somewhere else
        return BadRequestError(
            f"HTTP {status} is not an answer of {endpoint}: check base_url",
            code="UNEXPECTED_STATUS",
            status_code=status,
        )
    return BadRequestError(text, code=code or "BAD_REQUEST", status_code=status)


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
        escalated = body.get("outcome") == "escalated"
        return Decision(
            allowed=False,
            outcome="escalated" if escalated else "denied",
            reason=_reason(body.get("reason"))
            or ("approval required" if escalated else "denied by the authorization service"),
            policy_id=_loose(body, "policyId", str),
            rule_index=_loose(body, "ruleIndex", int),
            audit_id=_loose(body, "auditId", str),
            latency_ms=_loose(body, "latencyMs", float),
            retry_after_seconds=_loose(body, "retryAfterSeconds", int),
            approval_id=_loose_approval_id(body),
            approval_expires_at=_loose_instant(body, "approvalExpiresAt"),
            session_id=_loose(body, "sessionId", str),
            warnings=_warnings(body),
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
        approval_id=_approval_id(body),
        approval_expires_at=_instant(body, "approvalExpiresAt"),
        session_id=_optional(body, "sessionId", str),
        warnings=_warnings(body),
    )


def _warnings(body: dict[str, Any]) -> tuple[PolicyWarning, ...]:
    """The answer's well-formed warnings; a malformed one (or list) is left out, and never
    changes the decision: a warning is advice about a policy not enforced yet."""
    found = body.get("warnings")
    if not isinstance(found, list):
        return ()
    warnings = []
    for item in found[:MAX_WARNINGS]:
        if not isinstance(item, dict):
            continue
        policy_id, result = item.get("policyId"), item.get("result")
        reason = _reason(item.get("reason"))
        if (
            isinstance(policy_id, str)
            and APPROVAL_ID.fullmatch(policy_id)  # an id's shape: it goes into log lines
            and result in _WOULD_BE
            and reason is not None
        ):
            warnings.append(PolicyWarning(policy_id, str(result), reason))
    return tuple(warnings)


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


def _approval_id(body: dict[str, Any]) -> str | None:
    value: str | None = _optional(body, "approvalId", str)
    if value is not None and not APPROVAL_ID.fullmatch(value):
        raise _unreadable("has a malformed 'approvalId'")
    return value


def _loose_approval_id(body: dict[str, Any]) -> str | None:
    try:
        return _approval_id(body)
    except ServiceUnavailableError:
        return None


def _instant(body: dict[str, Any], name: str) -> datetime | None:
    """An ISO 8601 date-time field as an aware UTC datetime (one without an offset is UTC)."""
    value: str | None = _optional(body, name, str)
    if value is None:
        return None
    try:
        if not 10 <= len(value) <= 64:
            raise ValueError(value)
        moment = datetime.fromisoformat(value.upper())
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return moment.astimezone(UTC)
    except (ValueError, OverflowError):
        raise _unreadable(f"has a '{name}' that is not an ISO 8601 date-time") from None


def _loose_instant(body: dict[str, Any], name: str) -> datetime | None:
    try:
        return _instant(body, name)
    except ServiceUnavailableError:
        return None


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
