"""Pure policy evaluation: compiled policies + tool call + instant -> Decision.

Called by the API's authorize endpoint and by the controller's offline ``agentauth test``
runner. :func:`compile_policy` runs when policies are loaded and does all the expensive work
once (globs, RE2 programs, time zones); :func:`evaluate` runs on every authorization check.
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
from zoneinfo import ZoneInfo

import re2

from core.globs import ToolMatcher, compile_tools

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROS = 1_000_000
_MISSING: Any = object()
# Sunday-first names, the way allowedDays counts (0 = Sunday).
_DAY_NAMES = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
# The C++ binding behind re2's pure-Python wrapper: a search through it costs about a fifth of
# re2.compile(...).search(), which builds a Match object and maps byte offsets back to str.
_RE2_BINDING: Any = getattr(re2, "_re2", None)


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
        if not _is_number(value):
            return self.messages["number"]
        if self.minimum is not None and value < self.minimum:
            return self.messages["min"]
        if self.maximum is not None and value > self.maximum:
            return self.messages["max"]
        return None


def _is_number(value: Any) -> bool:
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


def compile_policy(
    *,
    id: str,
    name: str,
    priority: int,
    enabled: bool,
    created_at: datetime,
    rules: Sequence[Mapping[str, Any]],
) -> CompiledPolicy:
    """Compile a stored policy once; ``rules`` are schema-valid dicts as the API takes them.

    A naive ``created_at`` (SQLite hands those back) is taken as UTC. Raises
    :class:`PolicyCompileError` for what the schema cannot catch.
    """
    if created_at.tzinfo is None:
        created_at = created_at.replace(tzinfo=UTC)
    compiled = tuple(_compile_rule(id, name, index, rule) for index, rule in enumerate(rules))
    return CompiledPolicy(id, name, priority, enabled, created_at, compiled)


def _compile_rule(
    policy_id: str, policy_name: str, index: int, raw: Mapping[str, Any]
) -> CompiledRule:
    at = f"rules[{index}]"
    try:
        kind = RuleType(raw["type"])
    except (KeyError, ValueError):
        raise PolicyCompileError(f"{at}.type", "is not a known rule type") from None
    tools = compile_tools(raw.get("tools"))
    if kind is _ALLOW:
        reason = f"allowed by policy '{policy_name}' rule {index} (tool_allowlist)"
        return CompiledRule(index, kind, tools, granted=Decision(True, reason, policy_id, index))
    if kind is RuleType.RATE_LIMIT:
        spec = raw["rateLimit"]
        limit = RateLimitRef(
            policy_id, policy_name, index, int(spec["maxCalls"]), int(spec["windowSeconds"])
        )
        if limit.window_seconds < 1 or limit.max_calls < 1:
            raise PolicyCompileError(f"{at}.rateLimit", "maxCalls and windowSeconds must be >= 1")
        return CompiledRule(index, kind, tools, limit=limit)
    if kind is RuleType.TIME_BASED:
        return CompiledRule(index, kind, tools, window=_compile_window(raw["timeWindow"], at))
    if kind is RuleType.PARAMETER_CONSTRAINT:
        constraints = tuple(
            _compile_constraint(param, spec, f"{at}.parameters.{param}")
            for param, spec in (raw.get("parameters") or {}).items()
        )
        return CompiledRule(index, kind, tools, constraints=constraints)
    return CompiledRule(index, kind, tools)


def _compile_window(spec: Mapping[str, Any], at: str) -> TimeWindow:
    zone_name = spec.get("timezone", "UTC")
    zone: tzinfo = UTC
    if zone_name != "UTC":
        try:
            zone = ZoneInfo(zone_name)
        except (KeyError, ValueError, OSError):  # ZoneInfoNotFoundError is a KeyError
            raise PolicyCompileError(
                f"{at}.timeWindow.timezone", "is not an IANA time zone"
            ) from None
    hours, days = spec.get("allowedHours"), spec.get("allowedDays")
    return TimeWindow(
        zone,
        zone_name,
        None if hours is None else frozenset(hours),
        None if days is None else frozenset((day - 1) % 7 for day in days),  # Sunday 0 -> 6
    )


def _compile_constraint(name: str, spec: Mapping[str, Any], at: str) -> ParameterConstraint:
    minimum, maximum = spec.get("min"), spec.get("max")
    for bound, value in (("min", minimum), ("max", maximum)):
        if value is not None and not _is_number(value):
            raise PolicyCompileError(f"{at}.{bound}", "must be a finite number")
    enum = spec.get("enum")
    subject = f"parameter '{name}'"
    messages = {
        "missing": f"{subject} is required",
        "regex": f"{subject} must be a string matching regex '{spec.get('regex')}'",
        "enum": f"{subject} must be one of {_quote_list(enum or ())}",
        "number": f"{subject} must be a finite number",
        "min": f"{subject} must be at least {minimum}",
        "max": f"{subject} must be at most {maximum}",
    }
    search = _compile_search(spec["regex"], f"{at}.regex") if "regex" in spec else None
    allowed = None if enum is None else frozenset(enum)
    return ParameterConstraint(name, search, allowed, minimum, maximum, messages)


def _quote_list(values: Sequence[str], shown: int = 10) -> str:
    text = ", ".join(f"'{value}'" for value in values[:shown])
    return text if len(values) <= shown else f"{text}, ... ({len(values)} values)"


def _compile_search(pattern: str, at: str) -> Callable[[str], bool]:
    """An unanchored RE2 search for ``pattern``. A string RE2 cannot take as UTF-8 (a lone
    surrogate from a JSON escape) does not match: fail closed, never a crash."""
    options = re2.Options()
    options.log_errors = False  # the reason goes into our error, not onto stderr
    options.never_capture = True  # only "found or not" is needed: a faster program
    try:
        compiled = re2.compile(pattern, options)
    except re2.error as exc:
        detail = exc.args[0] if exc.args else "invalid pattern"
        if isinstance(detail, bytes):
            detail = detail.decode("utf-8", "replace")
        raise PolicyCompileError(at, f"is not a valid RE2 pattern: {detail}") from None
    if _RE2_BINDING is None:
        return lambda text: _search_wrapped(compiled, text)
    program = _RE2_BINDING.RE2(pattern.encode(), options)
    unanchored = _RE2_BINDING.RE2.Anchor.UNANCHORED

    def search(text: str) -> bool:
        try:
            data = text.encode()
        except UnicodeEncodeError:
            return False
        return bool(program.Match(unanchored, data, 0, len(data))[0][0] >= 0)

    return search


def _search_wrapped(compiled: Any, text: str) -> bool:
    try:
        return compiled.search(text) is not None
    except UnicodeEncodeError:
        return False


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
