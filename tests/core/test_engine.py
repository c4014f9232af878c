"""Unit and property tests for core.domain.engine and core.domain.globs.

Behaviour a policy author sees is mostly covered as data in tests/cases/*.yaml (run by
test_cases.py); this file covers the pieces those cases cannot reach: the glob matcher against
a reference on arbitrary input, window arithmetic, the consume contract, compile errors.
"""

from __future__ import annotations

import math
import types
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta, timezone
from functools import cache
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import re2
from hypothesis import given, settings
from hypothesis import strategies as st

from core.domain import compiler
from core.domain.compiler import compile_policy
from core.domain.engine import (
    CompiledPolicy,
    Decision,
    PendingGrant,
    PolicyCompileError,
    deny_agent_status,
    deny_unknown_agent,
    evaluate,
    order_policies,
    settle,
)
from core.domain.globs import Glob, compile_glob, compile_tools
from core.domain.limits import Charge, LimitRef, MemoryCounters, Refusal

NOW = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)  # Monday; epoch 1772445600
CREATED = datetime(2026, 1, 1, tzinfo=UTC)


def policy(
    name: str,
    *rules: dict[str, Any],
    priority: int = 0,
    enabled: bool = True,
    created_at: datetime = CREATED,
) -> CompiledPolicy:
    return compile_policy(
        id=name,
        name=name,
        priority=priority,
        enabled=enabled,
        created_at=created_at,
        rules=list(rules),
    )


def never_consume(charges: Sequence[Charge], now: datetime) -> Refusal | None:
    raise AssertionError("consume must not be called")


# --- globs -------------------------------------------------------------------------------


def reference_match(pattern: str, name: str) -> bool:
    """Textbook dynamic-programming glob match: obviously right, too slow for the hot path."""

    @cache
    def match(p: int, n: int) -> bool:
        if p == len(pattern):
            return n == len(name)
        if pattern[p] == "*":
            return match(p + 1, n) or (n < len(name) and match(p, n + 1))
        if n < len(name) and pattern[p] in ("?", name[n]):
            return match(p + 1, n + 1)
        return False

    return match(0, 0)


GLOB_TABLE = [
    ("calendar.*", "calendar.events.list", True),
    ("calendar.*", "calendar", False),
    ("*.read", "a.b.read", True),
    ("*.read", "read", False),
    ("a*b*c", "abc", True),
    ("a*b*c", "acb", False),
    ("a*a", "a", False),
    ("a*a", "aa", True),
    ("?", "", False),
    ("?", "é", True),
    ("*?*", "", False),
    ("a?*?b", "axyb", True),
    ("a?*?b", "axb", False),
    ("x*?y*z", "x.y.y.z", True),
    ("[ab]", "a", False),
    ("[ab]", "[ab]", True),
    ("", "", True),
    ("", "a", False),
    ("**", "", True),
    ("*aab", "aaab", True),
    ("*a?a", "aaba", True),
]


@pytest.mark.parametrize(
    ("pattern", "name", "expected"),
    GLOB_TABLE,
    ids=[f"{p!r}~{n!r}" for p, n, _ in GLOB_TABLE],
)
def test_glob_table(pattern: str, name: str, expected: bool) -> None:
    assert reference_match(pattern, name) is expected
    assert compile_glob(pattern)(name) is expected
    assert Glob.compile(pattern).matches(name) is expected


GLOB_ALPHABET = st.sampled_from("ab.?*[]é\\")


@settings(max_examples=2000)
@given(st.text(GLOB_ALPHABET, max_size=8), st.text(st.sampled_from("ab.?*[]é\\"), max_size=10))
def test_glob_agrees_with_reference_on_a_small_alphabet(pattern: str, name: str) -> None:
    assert compile_glob(pattern)(name) == reference_match(pattern, name)
    assert Glob.compile(pattern).matches(name) == reference_match(pattern, name)


@settings(max_examples=500)
@given(st.text(max_size=12), st.text(max_size=20))
def test_glob_never_crashes_and_agrees_on_arbitrary_text(pattern: str, name: str) -> None:
    assert compile_glob(pattern)(name) == reference_match(pattern, name)


@settings(max_examples=1000)
@given(st.lists(st.text(GLOB_ALPHABET, max_size=6), min_size=1, max_size=5), st.text(GLOB_ALPHABET))
def test_tool_list_matches_when_any_pattern_does(patterns: list[str], name: str) -> None:
    matcher = compile_tools(patterns)
    expected = any(reference_match(p, name) for p in patterns)
    assert (matcher is None or matcher(name)) == expected


@pytest.mark.parametrize("patterns", [None, ["*"], ["**"], ["mail.send", "*"]])
def test_tool_lists_that_match_everything_compile_to_none(patterns: list[str] | None) -> None:
    assert compile_tools(patterns) is None


# --- rate-limit windows ------------------------------------------------------------------


def test_counter_key_names_policy_and_rule() -> None:
    limit = LimitRef("p-1", "throttle", 3, 10, 60)
    assert limit.counter_key == "rule:p-1:3"


@pytest.mark.parametrize(
    ("now", "window", "start", "retry"),
    [
        (NOW, 60, 1772445600, 60),
        (NOW + timedelta(seconds=59, microseconds=1), 60, 1772445600, 1),
        (NOW + timedelta(microseconds=999_999), 60, 1772445600, 60),
        (NOW, 7, 1772445598, 5),
        (NOW.astimezone(ZoneInfo("Asia/Tokyo")), 86400, 1772409600, 50400),
        (datetime(1969, 12, 31, 23, 59, 30, tzinfo=UTC), 60, -60, 30),
        (datetime(1970, 1, 1, tzinfo=timezone(timedelta(hours=1))), 3600, -3600, 3600),
    ],
    ids=[
        "on-boundary",
        "last-microsecond",
        "fraction-rounds-up",
        "odd-window",
        "offset-now",
        "before-epoch",
        "before-epoch-offset",
    ],
)
def test_window_start_and_retry_after(now: datetime, window: int, start: int, retry: int) -> None:
    limit = LimitRef("p", "p", 0, 1, window)
    assert limit.window_start(now) == start
    assert limit.retry_after_seconds(now) == retry


@given(
    st.datetimes(
        min_value=datetime(1900, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
    ),
    st.integers(min_value=1, max_value=86400),
)
def test_window_arithmetic_properties(now: datetime, window: int) -> None:
    limit = LimitRef("p", "p", 0, 1, window)
    start = limit.window_start(now)
    exact = (now - datetime(1970, 1, 1, tzinfo=UTC)) / timedelta(seconds=1)
    assert start % window == 0
    assert start <= math.floor(exact) < start + window
    retry = limit.retry_after_seconds(now)
    assert 1 <= retry <= window
    assert limit.window_start(now + timedelta(seconds=retry)) == start + window


def test_window_of_a_naive_datetime_is_an_error() -> None:
    with pytest.raises(TypeError):
        LimitRef("p", "p", 0, 1, 60).window_start(datetime(2026, 3, 2, 10))


# --- MemoryCounters ----------------------------------------------------------------------


def test_memory_counters_take_all_or_nothing() -> None:
    counters = MemoryCounters()
    roomy, tight = LimitRef("a", "a", 0, 5, 60), LimitRef("b", "b", 0, 1, 60)
    both = [one_call(roomy), one_call(tight)]
    assert counters(both, NOW) is None
    assert counters(both, NOW) == Refusal(both[1], 1, 1772445600)
    assert (counters.used(roomy, NOW), counters.used(tight, NOW)) == (1, 1)
    assert counters([one_call(roomy)], NOW) is None
    assert counters.used(roomy, NOW) == 2


def test_memory_counters_reset_with_the_window() -> None:
    counters, limit = MemoryCounters(), LimitRef("a", "a", 0, 1, 60)
    call = [one_call(limit)]
    assert counters(call, NOW) is None
    assert counters(call, NOW + timedelta(seconds=59)) == Refusal(call[0], 1, 1772445600)
    assert counters(call, NOW + timedelta(seconds=60)) is None
    assert counters.used(limit, NOW) == 0


def one_call(limit: LimitRef) -> Charge:
    return Charge(limit, limit.counter_key, 1)


# --- evaluate: the consume contract and inputs -------------------------------------------


def test_consume_is_not_called_without_pending_limits() -> None:
    decision = settle(
        evaluate([policy("p", {"type": "tool_allowlist"})], "x", {}, NOW), never_consume
    )
    assert decision.allowed


def test_consume_gets_every_pending_limit_in_evaluation_order() -> None:
    seen: list[list[str]] = []

    def record(charges: Sequence[Charge], now: datetime) -> Refusal | None:
        assert now is NOW
        seen.append([charge.key for charge in charges])
        return None

    limit = {"type": "rate_limit", "rateLimit": {"maxCalls": 1, "windowSeconds": 60}}
    policies = order_policies(
        [
            policy("low", limit, {"type": "tool_allowlist"}, limit, priority=1),
            policy("high", limit, {**limit, "tools": ["other"]}, priority=2),
        ]
    )
    assert settle(evaluate(policies, "x", {}, NOW), record).policy_id == "low"
    assert seen == [["rule:high:0", "rule:low:0", "rule:low:2"]]


def test_evaluate_leaves_a_rate_limited_grant_pending_on_its_limits() -> None:
    limit = {"type": "rate_limit", "rateLimit": {"maxCalls": 1, "windowSeconds": 60}}
    policies = [policy("p", limit, {"type": "tool_allowlist"})]
    result = evaluate(policies, "x", {}, NOW)
    assert isinstance(result, PendingGrant)
    assert [charge.key for charge in result.limits] == ["rule:p:0"]
    assert (result.granted.allowed, result.granted.rule_index, result.now) == (True, 1, NOW)


def test_an_exhausted_limit_denies_with_retry_after() -> None:
    limit = {"type": "rate_limit", "rateLimit": {"maxCalls": 1, "windowSeconds": 60}}
    policies = [policy("p", {"type": "tool_allowlist"}, limit)]

    def exhausted(charges: Sequence[Charge], now: datetime) -> Refusal | None:
        return Refusal(charges[0], 1, charges[0].limit.window_start(now))

    later = NOW + timedelta(seconds=15)
    decision = settle(evaluate(policies, "x", {}, later), exhausted)
    assert decision == Decision(False, decision.reason, "p", 1, 45)
    assert decision.outcome == "denied"


def test_evaluate_skips_disabled_policies_even_if_given_them() -> None:
    policies = [policy("off", {"type": "tool_denylist"}, enabled=False)]
    policies.append(policy("on", {"type": "tool_allowlist"}))
    assert settle(evaluate(policies, "x", {}, NOW), never_consume).policy_id == "on"


def test_evaluate_refuses_a_naive_now() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        settle(evaluate([], "x", {}, datetime(2026, 3, 2, 10)), never_consume)


def test_evaluate_takes_any_mapping_of_parameters() -> None:
    rule = {"type": "parameter_constraint", "parameters": {"n": {"max": 3}}}
    policies = [policy("p", rule, {"type": "tool_allowlist"})]
    params = types.MappingProxyType({"n": 3})
    assert settle(evaluate(policies, "x", params, NOW), never_consume).allowed


def test_order_policies_sorts_by_priority_then_age_then_id() -> None:
    policies = [
        policy("c", priority=1, created_at=CREATED),
        policy("b", priority=1, created_at=CREATED),
        policy("old", priority=1, created_at=CREATED - timedelta(days=1)),
        policy("top", priority=9, created_at=CREATED + timedelta(days=1)),
        policy("off", priority=99, enabled=False),
    ]
    assert [p.id for p in order_policies(policies)] == ["top", "old", "b", "c"]


def test_compiled_policies_are_hashable() -> None:
    assert hash(GUARD) == hash(GUARD)


def test_a_naive_created_at_is_taken_as_utc() -> None:
    naive = policy("p", created_at=datetime(2026, 1, 1))
    assert naive.created_at == CREATED


# --- decisions outside evaluation --------------------------------------------------------


@pytest.mark.parametrize("status", ["suspended", "revoked"])
def test_agent_status_denies_without_a_policy(status: str) -> None:
    decision = deny_agent_status(status)
    assert (decision.allowed, decision.policy_id, decision.rule_index) == (False, None, None)
    assert decision.reason == f"agent is {status}"


def test_an_active_agent_has_no_status_deny() -> None:
    with pytest.raises(ValueError, match="active"):
        deny_agent_status("active")


def test_unknown_agent_reason_says_not_found() -> None:
    agent = "00000000-0000-4000-8000-000000000000"
    decision = deny_unknown_agent(agent)
    assert (decision.allowed, decision.policy_id) == (False, None)
    assert f"agent '{agent}' was not found" in decision.reason


# --- compiling ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rule", "path"),
    [
        ({"type": "nope"}, "rules[0].type"),
        (
            {"type": "parameter_constraint", "parameters": {"q": {"regex": "(?=a)"}}},
            "rules[0].parameters.q.regex",
        ),
        (
            {"type": "parameter_constraint", "parameters": {"q": {"regex": r"(a)\1"}}},
            "rules[0].parameters.q.regex",
        ),
        (
            {"type": "parameter_constraint", "parameters": {"q": {"min": math.nan}}},
            "rules[0].parameters.q.min",
        ),
        (
            {"type": "parameter_constraint", "parameters": {"q": {"max": True}}},
            "rules[0].parameters.q.max",
        ),
        (
            {"type": "time_based", "timeWindow": {"allowedHours": [1], "timezone": "Mars/Olympus"}},
            "rules[0].timeWindow.timezone",
        ),
        (
            {
                "type": "time_based",
                "timeWindow": {"allowedHours": [1], "timezone": "../etc/passwd"},
            },
            "rules[0].timeWindow.timezone",
        ),
        (
            {"type": "rate_limit", "rateLimit": {"maxCalls": 1, "windowSeconds": 0}},
            "rules[0].rateLimit",
        ),
    ],
    ids=[
        "unknown-type",
        "lookahead",
        "backreference",
        "nan-bound",
        "bool-bound",
        "unknown-zone",
        "path-zone",
        "zero-window",
    ],
)
def test_compile_errors_say_where(rule: dict[str, Any], path: str) -> None:
    with pytest.raises(PolicyCompileError) as caught:
        policy("p", rule)
    assert caught.value.path == path
    assert isinstance(caught.value, ValueError)


def test_a_catastrophic_backtracking_pattern_is_linear_under_re2() -> None:
    rule = {"type": "parameter_constraint", "parameters": {"q": {"regex": "^(a+)+$"}}}
    policies = [policy("p", rule, {"type": "tool_allowlist"})]
    decision = settle(evaluate(policies, "x", {"q": "a" * 50_000 + "!"}, NOW), never_consume)
    assert not decision.allowed


SEARCH_PATTERNS = ["cat", "^a", "b$", "[0-9]+", "é.", r"\bword\b", "(?i)case", "", "a|b"]


#: text as JSON may carry it: mostly ordinary, sometimes with a lone surrogate (a ``\ud800``
#: escape), which has no UTF-8 form
SEARCH_TEXTS = st.text(max_size=30) | st.builds(
    "{}\ud800{}".format, st.text(max_size=10), st.text(max_size=10)
)


@given(st.sampled_from(SEARCH_PATTERNS), SEARCH_TEXTS)
def test_regex_search_agrees_with_re2_search_on_text(pattern: str, text: str) -> None:
    search = compiler._compile_search(pattern, "p")
    # our promise for text that has no UTF-8 form (a lone surrogate): no match, never a crash;
    # what re2.search itself does with such text (raise, and which error) is its own business
    expected = _has_utf8_form(text) and re2.search(pattern, text) is not None
    assert search(text) == expected


def _has_utf8_form(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def test_regex_search_says_found_or_not_and_never_matches_a_lone_surrogate() -> None:
    search = compiler._compile_search("ca+t", "p")
    assert [search("concaaat"), search("dog"), search("\ud800")] == [True, False, False]


def test_a_pattern_too_large_for_an_re2_set_is_still_searched() -> None:
    # 300 letters of any script: RE2 compiles it, but its DFA for a Set has too little memory
    search = compiler._compile_search(r"\pL{300}", "p")
    assert [search("é" * 300), search("x" + "é" * 299), search("é" * 299)] == [True, True, False]


def test_a_lone_surrogate_fails_a_regex_instead_of_crashing() -> None:
    rule = {"type": "parameter_constraint", "parameters": {"q": {"regex": "."}}}
    policies = [policy("p", rule, {"type": "tool_allowlist"})]
    decision = settle(evaluate(policies, "x", {"q": "a\ud800"}, NOW), never_consume)
    assert (decision.allowed, decision.rule_index) == (False, 0)


# --- properties over arbitrary requests --------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
GUARD = policy(
    "guard",
    {
        "type": "parameter_constraint",
        "parameters": {
            "a": {"regex": "^x"},
            "b": {"enum": ["one", "two"]},
            "c": {"min": -1.5, "max": 10},
        },
    },
    {"type": "tool_allowlist"},
)


@given(st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), JSON, max_size=4))
def test_constraints_never_crash_and_deny_unless_all_hold(parameters: dict[str, Any]) -> None:
    decision = settle(evaluate([GUARD], "x", parameters, NOW), never_consume)
    a, b, c = (parameters.get(key) for key in "abc")
    holds = (
        isinstance(a, str)
        and a.startswith("x")
        and b in ("one", "two")
        and isinstance(c, int | float)
        and type(c) is not bool
        and math.isfinite(c)
        and -1.5 <= c <= 10
    )
    assert decision.allowed == holds


@given(st.text(min_size=1, max_size=20), st.sampled_from(["a", "b", "c"]))
def test_a_deny_reason_never_contains_the_value(secret: str, key: str) -> None:
    value = f"SECRET-{secret}"
    decision = settle(
        evaluate([GUARD], "x", {"a": "x", "b": "one", "c": 0, key: value}, NOW), never_consume
    )
    assert not decision.allowed
    assert value not in decision.reason


ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Pacific/Auckland", "Asia/Kolkata"]


@given(
    st.datetimes(
        min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
    ),
    st.sampled_from(ZONES),
    st.integers(0, 6),
    st.integers(0, 23),
)
def test_time_window_uses_local_hour_and_sunday_first_weekday(
    now: datetime, zone: str, day: int, hour: int
) -> None:
    window = {"allowedDays": [day], "allowedHours": [hour], "timezone": zone}
    policies = [
        policy("p", {"type": "time_based", "timeWindow": window}, {"type": "tool_allowlist"})
    ]
    local = now.astimezone(ZoneInfo(zone))
    inside = local.isoweekday() % 7 == day and local.hour == hour
    assert settle(evaluate(policies, "x", {}, now), never_consume).allowed == inside
