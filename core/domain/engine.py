"""Pure policy evaluation: compiled policies + tool call + instant -> Decision.

:func:`evaluate` runs on every check, over policies :func:`core.domain.compiler.compile_policy`
prepared once. No IO, no clock: the caller passes ``now``; a grant that depends on rate
limits comes back as a :class:`PendingGrant`, and a call a require_approval rule sends to a
person as :class:`NeedsApproval`; :func:`settle` decides either with the caller's counters and
approvals (the database's in ``core.hotpath.decisions``, in memory in the controller's test
runner and impact replay). Semantics: decisions §1 (order), §2 (rule types), §3 (fields), §6
(approval). Over 300 lines: the rule types, the evaluation walk and its settling are one
table of semantics, read together when any of them changes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from enum import StrEnum
from typing import Any

from core.domain.approvals import ApprovalStatus, CallApprovals
from core.domain.globs import ToolMatcher
from core.domain.limits import Charge, Consume, LimitRef, Refusal

_MISSING: Any = object()
# Sunday-first names, the way allowedDays counts (0 = Sunday).
_DAY_NAMES = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")


class RuleType(StrEnum):
    TOOL_ALLOWLIST = "tool_allowlist"
    TOOL_DENYLIST = "tool_denylist"
    PARAMETER_CONSTRAINT = "parameter_constraint"
    RATE_LIMIT = "rate_limit"
    TIME_BASED = "time_based"
    REQUIRE_APPROVAL = "require_approval"
    BUDGET = "budget"


_ALLOW = RuleType.TOOL_ALLOWLIST
_DENY = RuleType.TOOL_DENYLIST
_DENYING = frozenset({_DENY, RuleType.PARAMETER_CONSTRAINT, RuleType.TIME_BASED})


class PolicyCompileError(ValueError):
    """A rule that passed the schema still cannot be compiled (bad RE2 pattern, unknown zone).

    ``path`` locates it the way :func:`schemas.format_path` does, e.g. ``rules[2].timeWindow``.
    """

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        super().__init__(f"{path}: {message}")


@dataclass(frozen=True, slots=True)
class Decision:
    """``approval_id`` names the approval an allow used, a deny was caused by, or an escalated
    call waits for (decisions §6); ``approval_expires_at`` is set on escalated decisions only."""

    allowed: bool
    reason: str
    policy_id: str | None = None
    rule_index: int | None = None
    retry_after_seconds: int | None = None
    approval_id: str | None = None
    approval_expires_at: datetime | None = None

    @property
    def outcome(self) -> str:
        if self.allowed:
            return "allowed"
        return "denied" if self.approval_expires_at is None else "escalated"


@dataclass(frozen=True, slots=True, eq=False)  # identity: holds a dict and a compiled program
class ParameterConstraint:
    """One entry of a parameter_constraint rule's ``parameters``, with its deny messages
    prepared up front. Messages name the parameter and the constraint, never the value."""

    name: str
    search: Callable[[str], bool] | None
    enum: frozenset[str] | None
    minimum: int | float | None
    maximum: int | float | None
    messages: Mapping[str, str]

    def violation(self, parameters: Mapping[str, Any]) -> str | None:
        """Why the request breaks this constraint, or None when it holds."""
        value = parameters.get(self.name, _MISSING)
        if value is _MISSING:
            return self.messages["missing"]
        if self.search is not None and not (isinstance(value, str) and self.search(value)):
            return self.messages["regex"]
        if self.enum is not None and not (isinstance(value, str) and value in self.enum):
            return self.messages["enum"]
        if self.minimum is None and self.maximum is None:
            return None
        if not is_number(value):
            return self.messages["number"]
        if self.minimum is not None and value < self.minimum:
            return self.messages["min"]
        if self.maximum is not None and value > self.maximum:
            return self.messages["max"]
        return None


def is_number(value: Any) -> bool:
    """A finite JSON number: booleans, numeric strings, NaN and infinities are not."""
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class TimeWindow:
    """A time_based rule's window. ``weekdays`` holds Python weekday numbers (Monday = 0),
    converted from allowedDays (Sunday = 0) at compile time."""

    zone: tzinfo
    zone_name: str
    hours: frozenset[int] | None
    weekdays: frozenset[int] | None

    def violation(self, now: datetime) -> str | None:
        local = now.astimezone(self.zone)
        if self.hours is not None and local.hour not in self.hours:
            return f"outside allowed hours ({self._local_time_phrase(local)})"
        if self.weekdays is not None and local.weekday() not in self.weekdays:
            return f"outside allowed days ({self._local_time_phrase(local)})"
        return None

    def _local_time_phrase(self, local: datetime) -> str:
        day = _DAY_NAMES[(local.weekday() + 1) % 7]
        return f"it is {day} {local:%H:%M} in {self.zone_name}"


@dataclass(frozen=True, slots=True)
class CompiledRule:
    """A rule ready for evaluation. ``tools`` None matches every tool; ``granted`` is the
    (immutable, shared) allow decision of a tool_allowlist rule; ``denies``: a rule that
    denies when it does not pass (denylist, constraints, time window), set from ``type``."""

    index: int
    type: RuleType
    tools: ToolMatcher | None
    constraints: tuple[ParameterConstraint, ...] = ()
    window: TimeWindow | None = None
    limit: LimitRef | None = None
    granted: Decision | None = None
    approval_ttl_seconds: int | None = None
    denies: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "denies", self.type in _DENYING)


@dataclass(frozen=True, slots=True)
class CompiledPolicy:
    id: str
    name: str
    priority: int
    enabled: bool
    created_at: datetime
    rules: tuple[CompiledRule, ...]
    #: "enforce", "warn" or "shadow" (``core.domain.modes``): :func:`evaluate` treats them
    #: alike; which policies it is given is the caller's choice
    mode: str = "enforce"


@dataclass(frozen=True, slots=True)
class PendingGrant:
    """An allow that holds only if every one of ``limits`` can be charged (all or none); ``now``
    is the instant it was evaluated at. :func:`settle` decides it."""

    granted: Decision
    limits: tuple[Charge, ...]
    now: datetime


@dataclass(frozen=True, slots=True)
class NeedsApproval:
    """A call that a require_approval rule sends to a human (decisions §6): the policy and rule
    that decide, ``problem`` (why approval is needed, in words), how long a new approval lives,
    and the limits an approved call is charged to, as any grant would."""

    policy_id: str
    policy_name: str
    rule_index: int
    problem: str
    ttl_seconds: int
    limits: tuple[Charge, ...]
    now: datetime


Evaluated = Decision | PendingGrant | NeedsApproval


def evaluate(
    policies: Sequence[CompiledPolicy],
    tool_name: str,
    parameters: Mapping[str, Any],
    now: datetime,
    session_id: str | None = None,
) -> Evaluated:
    """The decision for one tool call (decisions §1, §6 and §8); or, when the granting policy's
    rate limits and budgets must be consulted, the grant pending on them; or, when a
    require_approval rule asks for a human, what the caller's approvals must settle.
    ``policies`` come from :func:`order_policies`; ``now`` must be timezone-aware;
    ``session_id`` is the call's session, if it named one. Counters and approvals are never
    touched here: see :func:`settle`."""
    if now.tzinfo is None:  # a naive instant would silently mean the host's local time
        raise ValueError("now must be a timezone-aware datetime")
    pending: list[Charge] = []
    escalating: tuple[CompiledRule, str] | None = None  # set only on the way to a return
    for policy in policies:
        if not policy.enabled:
            continue
        # the allow of this policy, or _ESCALATES once one of its rules asks for a person:
        # one test at the end of a policy that decides nothing, as before approvals
        granted: Decision | None = None
        for rule in policy.rules:
            if rule.tools is not None and not rule.tools(tool_name):
                continue
            if rule.type is _ALLOW:
                if granted is None:
                    granted = rule.granted
            elif rule.denies:  # the common case first
                problem = _violation(rule, tool_name, parameters, now)
                if problem is not None:
                    return _deny(policy.id, policy.name, rule.index, rule.type, problem)
            elif rule.limit is not None:
                charge = rule.limit.charge(parameters, session_id)
                if isinstance(charge, str):  # no session, or no amount to count: not counted
                    return _deny(policy.id, policy.name, rule.index, rule.type, charge)
                pending.append(charge)
            elif granted is not _ESCALATES:  # a require_approval rule; the first that asks
                problem = _approval_needed(rule, tool_name, parameters)
                if problem is not None:
                    escalating, granted = (rule, problem), _ESCALATES
        if granted is not None:
            if granted is _ESCALATES and escalating is not None:  # deny > escalate > grant
                rule, problem = escalating
                ttl = rule.approval_ttl_seconds or DEFAULT_APPROVAL_TTL_SECONDS
                limits = tuple(pending)
                return NeedsApproval(policy.id, policy.name, rule.index, problem, ttl, limits, now)
            return PendingGrant(granted, tuple(pending), now) if pending else granted
    return Decision(False, f"default deny: no policy allows tool '{tool_name}'")


#: stands in a policy's ``granted`` once a require_approval rule of it asks for a person
_ESCALATES = Decision(False, "needs approval")

#: how long an approval lives when its rule does not say, and the bounds (decisions §6)
DEFAULT_APPROVAL_TTL_SECONDS = 3600
MIN_APPROVAL_TTL_SECONDS, MAX_APPROVAL_TTL_SECONDS = 60, 604_800


def _approval_needed(
    rule: CompiledRule, tool_name: str, parameters: Mapping[str, Any]
) -> str | None:
    """Why a require_approval rule in scope needs a human for this call, or None: always
    without constraints, else when any constraint fails."""
    if not rule.constraints:
        return f"tool '{tool_name}' requires approval"
    for constraint in rule.constraints:
        problem = constraint.violation(parameters)
        if problem is not None:
            return problem
    return None


def _violation(
    rule: CompiledRule, tool_name: str, parameters: Mapping[str, Any], now: datetime
) -> str | None:
    """Why a denylist, constraint or time rule in scope denies the call, or None."""
    if rule.type is _DENY:
        return f"tool '{tool_name}' is denied"
    if rule.window is not None:
        return rule.window.violation(now)
    for constraint in rule.constraints:
        problem = constraint.violation(parameters)
        if problem is not None:
            return problem
    return None


def settle(result: Evaluated, consume: Consume, approvals: CallApprovals | None = None) -> Decision:
    """The decision :func:`evaluate` left open. A grant pending on limits: granted when
    ``consume`` took every charge, else the deny of the limit that could not take its own.
    A call that needs approval: settled with ``approvals``, the call's own (decisions §6;
    None when the call cannot be bound to an approval, and then it is denied). A decision
    already made is returned as it is, and neither is touched."""
    if isinstance(result, PendingGrant):
        return take_limits(result.limits, result.now, consume) or result.granted
    if isinstance(result, NeedsApproval):
        return _settle_approval(result, consume, approvals)
    return result


def _settle_approval(
    needs: NeedsApproval, consume: Consume, approvals: CallApprovals | None
) -> Decision:
    """Deny > escalate > grant was decided by :func:`evaluate`; here the call's approvals say
    which of grant, deny or escalate a call that needs one gets."""
    policy, index, now = needs.policy_id, needs.rule_index, needs.now
    rule = f"policy '{needs.policy_name}' rule {index} (require_approval)"
    if approvals is None:
        reason = (
            f"denied by {rule}: {needs.problem}, and the call cannot be bound to an approval "
            "(a number JSON cannot represent exactly, or an API key in the tool name)"
        )
        return Decision(False, reason, policy, index)
    found = approvals.current(now)
    if found is not None and found.status is ApprovalStatus.APPROVED:
        if approvals.use(found.id, now):
            refused = take_limits(needs.limits, now, consume)
            if refused is not None:  # the approval stays approved: nothing is consumed
                approvals.restore(found.id)
                return refused
            reason = f"allowed by {rule}: approval {found.id} was granted"
            return Decision(True, reason, policy, index, approval_id=found.id)
        found = None  # another identical call used it first: this one asks anew
    if found is not None and found.status is ApprovalStatus.DENIED:
        reason = f"denied by {rule}: approval {found.id} was denied"
        return Decision(False, reason, policy, index, approval_id=found.id)
    pending = approvals.request(needs.ttl_seconds, policy, index, now)
    reason = f"approval required by {rule}: {needs.problem}"
    return Decision(
        False, reason, policy, index, approval_id=pending.id, approval_expires_at=pending.expires_at
    )


def take_limits(limits: tuple[Charge, ...], now: datetime, consume: Consume) -> Decision | None:
    """None when every charge of ``limits`` was taken (or there are none); else the deny of the
    limit that could not take its charge, and nothing was taken."""
    if not limits:
        return None
    refused = consume(limits, now)
    return None if refused is None else limited(refused, now)


def limited(refused: Refusal, now: datetime) -> Decision:
    """The deny of the limit that could not take its charge."""
    limit = refused.charge.limit
    retry = refused.retry_after_seconds(now)
    per = " per session" if limit.per == "session" else ""
    window = f"per {limit.window_seconds} seconds{per}"
    if limit.parameter is None:
        problem = f"rate limit of {limit.maximum} calls {window} exceeded"
    else:
        problem = (
            f"budget of {limit.shown(limit.maximum)} '{limit.parameter}' {window} exceeded: "
            f"{limit.shown(refused.used)} spent, this call {limit.shown(refused.charge.amount)}"
        )
    reason = (
        f"denied by policy '{limit.policy_name}' rule {limit.rule_index} ({limit.kind}): "
        f"{problem}; retry after {retry} seconds"
    )
    return Decision(False, reason, limit.policy_id, limit.rule_index, retry)


def _deny(policy_id: str, name: str, index: int, kind: str, problem: str) -> Decision:
    reason = f"denied by policy '{name}' rule {index} ({kind}): {problem}"
    return Decision(False, reason, policy_id, index)


def deny_agent_status(status: str) -> Decision:
    """The decision for an agent that may not act (``suspended`` or ``revoked``)."""
    if status == "active":
        raise ValueError("an active agent is not denied by its status")
    return Decision(False, f"agent is {status}")


def deny_unknown_agent(agent_id: str) -> Decision:
    return Decision(False, f"agent '{agent_id}' was not found")


def order_policies(policies: Iterable[CompiledPolicy]) -> list[CompiledPolicy]:
    """Enabled policies in evaluation order: priority high to low, then older createdAt,
    then smaller id."""
    enabled = (policy for policy in policies if policy.enabled)
    return sorted(enabled, key=lambda p: (-p.priority, p.created_at, p.id))
