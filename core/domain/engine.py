"""Pure policy evaluation: compiled policies + tool call + instant -> Decision.

Called by the API's authorize endpoint and by the controller's offline ``agentauth test``
runner. :func:`core.domain.compiler.compile_policy` runs when policies are loaded and does all the
expensive work once (globs, RE2 programs, time zones); :func:`evaluate` runs on every check.
Nothing here does IO or reads a clock: the caller passes ``now`` and a ``consume`` callable
that owns the rate-limit counters (the database in the API, :class:`MemoryCounters` offline).

Semantics follow decisions §1 (evaluation order), §2 (rule types) and §3 (decision fields).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from enum import StrEnum
from typing import Any, Protocol

from core.domain.globs import ToolMatcher

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROS = 1_000_000
_MISSING: Any = object()
# Sunday-first names, the way allowedDays counts (0 = Sunday).
_DAY_NAMES = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")


class RuleType(StrEnum):
    TOOL_ALLOWLIST = "tool_allowlist"
    TOOL_DENYLIST = "tool_denylist"
    PARAMETER_CONSTRAINT = "parameter_constraint"
    RATE_LIMIT = "rate_limit"
    TIME_BASED = "time_based"


_ALLOW = RuleType.TOOL_ALLOWLIST
_DENY = RuleType.TOOL_DENYLIST


class PolicyCompileError(ValueError):
    """A rule that passed the schema still cannot be compiled (bad RE2 pattern, unknown zone).

    ``path`` locates it the way :func:`schemas.format_path` does, e.g. ``rules[2].timeWindow``.
    """

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        super().__init__(f"{path}: {message}")


@dataclass(frozen=True, slots=True)
class RateLimitRef:
    """One rate_limit rule: its counter is shared by every tool in the rule's scope."""

    policy_id: str
    policy_name: str
    rule_index: int
    max_calls: int
    window_seconds: int

    @property
    def counter_key(self) -> str:
        return f"rule:{self.policy_id}:{self.rule_index}"

    def window_start(self, now: datetime) -> int:
        """Start (epoch seconds) of the fixed window holding ``now``; windows are aligned to
        multiples of ``window_seconds`` since the Unix epoch."""
        return _epoch_micros(now) // (self.window_seconds * _MICROS) * self.window_seconds

    def retry_after_seconds(self, now: datetime) -> int:
        """Whole seconds until the window holding ``now`` ends, rounded up, at least 1."""
        micros = _epoch_micros(now)
        end = (micros // (self.window_seconds * _MICROS) + 1) * self.window_seconds * _MICROS
        return max(1, -((micros - end) // _MICROS))


def _epoch_micros(now: datetime) -> int:
    """Exact microseconds since the epoch (no float rounding at window boundaries)."""
    delta = now - _EPOCH  # raises TypeError for a naive datetime: fail loudly, not locally
    return (delta.days * 86_400 + delta.seconds) * _MICROS + delta.microseconds


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    reason: str
    policy_id: str | None = None
    rule_index: int | None = None
    retry_after_seconds: int | None = None

    @property
    def outcome(self) -> str:
        return "allowed" if self.allowed else "denied"


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
            return f"outside allowed hours ({self._describe(local)})"
        if self.weekdays is not None and local.weekday() not in self.weekdays:
            return f"outside allowed days ({self._describe(local)})"
        return None

    def _describe(self, local: datetime) -> str:
        day = _DAY_NAMES[(local.weekday() + 1) % 7]
        return f"it is {day} {local:%H:%M} in {self.zone_name}"


@dataclass(frozen=True, slots=True)
class CompiledRule:
    """A rule ready for evaluation. ``tools`` None matches every tool; ``granted`` is the
    (immutable, shared) allow decision of a tool_allowlist rule."""

    index: int
    type: RuleType
    tools: ToolMatcher | None
    constraints: tuple[ParameterConstraint, ...] = ()
    window: TimeWindow | None = None
    limit: RateLimitRef | None = None
    granted: Decision | None = None


@dataclass(frozen=True, slots=True)
class CompiledPolicy:
    id: str
    name: str
    priority: int
    enabled: bool
    created_at: datetime
    rules: tuple[CompiledRule, ...]


class Consume(Protocol):
    def __call__(self, limits: Sequence[RateLimitRef], now: datetime) -> RateLimitRef | None:
        """Take one call from EVERY limit, all or none. None when taken; otherwise the first
        exhausted limit, and nothing was taken. Only called with a non-empty sequence."""
        ...


def evaluate(
    policies: Sequence[CompiledPolicy],
    tool_name: str,
    parameters: Mapping[str, Any],
    now: datetime,
    consume: Consume,
) -> Decision:
    """The decision for one tool call (decisions §1). ``policies`` come from
    :func:`order_policies`; ``now`` must be timezone-aware."""
    if now.tzinfo is None:  # a naive instant would silently mean the host's local time
        raise ValueError("now must be a timezone-aware datetime")
    pending: list[RateLimitRef] = []
    for policy in policies:
        if not policy.enabled:
            continue
        granted: Decision | None = None
        for rule in policy.rules:
            if rule.tools is not None and not rule.tools(tool_name):
                continue
            if rule.type is _ALLOW:
                if granted is None:
                    granted = rule.granted
            elif rule.limit is not None:
                pending.append(rule.limit)
            else:
                problem = _violation(rule, tool_name, parameters, now)
                if problem is not None:
                    return _deny(policy.id, policy.name, rule.index, rule.type, problem)
        if granted is not None:
            return _grant(granted, pending, now, consume)
    return Decision(False, f"default deny: no policy allows tool '{tool_name}'")


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


def _grant(
    granted: Decision, pending: list[RateLimitRef], now: datetime, consume: Consume
) -> Decision:
    if pending:
        exhausted = consume(pending, now)
        if exhausted is not None:
            return _rate_limited(exhausted, now)
    return granted


def _rate_limited(limit: RateLimitRef, now: datetime) -> Decision:
    retry = limit.retry_after_seconds(now)
    reason = (
        f"denied by policy '{limit.policy_name}' rule {limit.rule_index} (rate_limit): "
        f"rate limit of {limit.max_calls} calls per {limit.window_seconds} seconds "
        f"exceeded; retry after {retry} seconds"
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


class MemoryCounters:
    """An in-memory :class:`Consume` for tests and the offline ``agentauth test`` runner.

    One process only; a lock makes each call all-or-none across threads. Keeps one window per
    counter, so memory stays bounded by the number of rate_limit rules.
    """

    def __init__(self) -> None:
        self._windows: dict[str, tuple[int, int]] = {}  # counter_key -> (window_start, count)
        self._lock = threading.Lock()

    def __call__(self, limits: Sequence[RateLimitRef], now: datetime) -> RateLimitRef | None:
        with self._lock:
            starts = [limit.window_start(now) for limit in limits]
            for limit, start in zip(limits, starts, strict=True):
                if self._count(limit.counter_key, start) >= limit.max_calls:
                    return limit
            for limit, start in zip(limits, starts, strict=True):
                key = limit.counter_key
                self._windows[key] = (start, self._count(key, start) + 1)
        return None

    def used(self, limit: RateLimitRef, now: datetime) -> int:
        """Calls taken from ``limit`` in the window holding ``now``."""
        with self._lock:
            return self._count(limit.counter_key, limit.window_start(now))

    def _count(self, key: str, start: int) -> int:
        window = self._windows.get(key)
        return window[1] if window is not None and window[0] == start else 0
