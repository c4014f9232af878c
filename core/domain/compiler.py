"""Compiling stored policies for the engine: globs, RE2 programs, time zones and deny messages
are prepared once here, so :func:`core.domain.engine.evaluate` does no such work per call.

Called by ``core.hotpath.decisions`` (the API's policy cache) and by the controller's offline
test runner and impact replay (``controller.impact``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, tzinfo
from typing import Any
from zoneinfo import ZoneInfo

import re2

from core.domain.engine import (
    DEFAULT_APPROVAL_TTL_SECONDS,
    MAX_APPROVAL_TTL_SECONDS,
    MIN_APPROVAL_TTL_SECONDS,
    CompiledPolicy,
    CompiledRule,
    Decision,
    ParameterConstraint,
    PolicyCompileError,
    RuleType,
    TimeWindow,
    is_number,
)
from core.domain.globs import compile_tools
from core.domain.limits import MAX_BUDGET, LimitRef, max_units
from core.domain.rules import compile_regex


def compile_policy(
    *,
    id: str,
    name: str,
    priority: int,
    enabled: bool,
    created_at: datetime,
    rules: Sequence[Mapping[str, Any]],
    mode: str = "enforce",
) -> CompiledPolicy:
    """Compile a stored policy once; ``rules`` are schema-valid dicts as the API takes them.

    A naive ``created_at`` (SQLite hands those back) is taken as UTC. Raises
    :class:`PolicyCompileError` for what the schema cannot catch.
    """
    if created_at.tzinfo is None:
        created_at = created_at.replace(tzinfo=UTC)
    compiled = tuple(_compile_rule(id, name, index, rule) for index, rule in enumerate(rules))
    return CompiledPolicy(id, name, priority, enabled, created_at, compiled, mode)


def _compile_rule(
    policy_id: str, policy_name: str, index: int, raw: Mapping[str, Any]
) -> CompiledRule:
    at = f"rules[{index}]"
    try:
        kind = RuleType(raw["type"])
    except (KeyError, ValueError):
        raise PolicyCompileError(f"{at}.type", "is not a known rule type") from None
    tools = compile_tools(raw.get("tools"))
    if kind is RuleType.TOOL_ALLOWLIST:
        reason = f"allowed by policy '{policy_name}' rule {index} (tool_allowlist)"
        return CompiledRule(index, kind, tools, granted=Decision(True, reason, policy_id, index))
    if kind is RuleType.RATE_LIMIT or kind is RuleType.BUDGET:
        return CompiledRule(
            index, kind, tools, limit=_compile_limit(policy_id, policy_name, index, raw)
        )
    if kind is RuleType.TIME_BASED:
        return CompiledRule(index, kind, tools, window=_compile_window(raw["timeWindow"], at))
    constraints = tuple(
        _compile_constraint(param, spec, f"{at}.parameters.{param}")
        for param, spec in (raw.get("parameters") or {}).items()
    )
    if kind is RuleType.REQUIRE_APPROVAL:
        ttl = int((raw.get("approval") or {}).get("ttlSeconds", DEFAULT_APPROVAL_TTL_SECONDS))
        if not MIN_APPROVAL_TTL_SECONDS <= ttl <= MAX_APPROVAL_TTL_SECONDS:
            raise PolicyCompileError(
                f"{at}.approval.ttlSeconds",
                f"must be {MIN_APPROVAL_TTL_SECONDS} to {MAX_APPROVAL_TTL_SECONDS:,} seconds",
            )
        return CompiledRule(index, kind, tools, constraints=constraints, approval_ttl_seconds=ttl)
    return CompiledRule(index, kind, tools, constraints=constraints)


def _compile_limit(
    policy_id: str, policy_name: str, index: int, raw: Mapping[str, Any]
) -> LimitRef:
    """A rate_limit's or budget's counter (decisions §2 and §8)."""
    at, per = f"rules[{index}]", raw.get("per", "agent")
    if per not in ("agent", "session"):
        raise PolicyCompileError(f"{at}.per", "must be agent or session")
    if raw["type"] == RuleType.RATE_LIMIT:
        spec, where = raw["rateLimit"], f"{at}.rateLimit"
        maximum, parameter = int(spec["maxCalls"]), None
    else:
        spec, where = raw["budget"], f"{at}.budget"
        ceiling = spec["max"]
        if isinstance(ceiling, bool) or not 0 < ceiling <= MAX_BUDGET:
            raise PolicyCompileError(f"{where}.max", f"must be above 0 and at most {MAX_BUDGET:,}")
        maximum, parameter = max_units(ceiling), str(spec["parameter"])
    window = int(spec["windowSeconds"])
    if window < 1 or maximum < 1:
        raise PolicyCompileError(where, "the maximum and windowSeconds must be above 0")
    kind = str(raw["type"])
    return LimitRef(policy_id, policy_name, index, maximum, window, kind, per, parameter)


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
        if value is not None and not is_number(value):
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
    try:
        compile_regex(pattern)  # the same check, and the same error, as the API's
    except ValueError as exc:
        raise PolicyCompileError(at, f"is not a valid RE2 pattern: {exc}") from None
    # RE2's search through its public API builds a Match object and maps byte offsets back to
    # str; a Set answers "which patterns occur" in one call on the DFA (bench/RESULTS.md). Both
    # read UTF-8 bytes, RE2's own encoding, so the matches are those of the str. The Set also
    # holds the empty pattern, which occurs in every text: when not even that is reported, the
    # DFA gave up (RE2's own search would go on with the NFA), so that search decides.
    encoded = pattern.encode()
    program = re2.compile(encoded, _SEARCH_OPTIONS)
    patterns = _set_with_empty_pattern(encoded)

    def search(text: str) -> bool:
        try:
            data = text.encode()
        except UnicodeEncodeError:
            return False
        found = patterns.Match(data)
        if found is None:
            return program.search(data) is not None
        return 0 in found

    return search


def _set_with_empty_pattern(pattern: bytes) -> Any:
    """An RE2 Set of ``pattern`` (index 0) and the empty pattern; a program too large for a
    Set's DFA gives a stand-in whose ``Match`` reports nothing, so RE2's search decides."""
    patterns = re2.Set.SearchSet(_SEARCH_OPTIONS)
    try:
        patterns.Add(pattern)
        patterns.Add(b"")
        patterns.Compile()
    except re2.error:
        return _NO_SET
    return patterns


class _NoSet:
    @staticmethod
    def Match(data: bytes) -> None:  # noqa: N802 (re2.Set's spelling)
        return None


_NO_SET = _NoSet()


def _search_options() -> Any:
    options = re2.Options()
    options.log_errors = False
    options.never_capture = True
    return options


_SEARCH_OPTIONS = _search_options()
