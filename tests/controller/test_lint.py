"""controller.lint: rules a higher-priority policy always decides first, and glob coverage.

The glob check is tested against brute force over short names (soundness and completeness),
and the shadow finder against the engine itself: a rule reported as never reached can be
swapped for an allowlist or a denylist without changing any decision.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.lint import LintPolicy, Shadow, glob_covers, shadow_message, shadowed_rules
from core.domain.compiler import compile_policy
from core.domain.engine import evaluate, order_policies, settle
from core.domain.globs import compile_glob
from core.domain.limits import MemoryCounters

NOW = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)  # Monday


def rule(kind: str, *tools: str) -> dict[str, Any]:
    """A rule of ``kind``; no tools given means tools omitted (every tool)."""
    out: dict[str, Any] = {"type": kind}
    if tools:
        out["tools"] = list(tools)
    if kind == "parameter_constraint":
        out["parameters"] = {"amount": {"max": 100}}
    elif kind == "time_based":
        out["timeWindow"] = {"allowedHours": [9, 10, 11]}
    elif kind == "rate_limit":
        out["rateLimit"] = {"maxCalls": 5, "windowSeconds": 60}
    return out


def allow(*tools: str) -> dict[str, Any]:
    return rule("tool_allowlist", *tools)


def deny(*tools: str) -> dict[str, Any]:
    return rule("tool_denylist", *tools)


def policy(name: str, priority: int, *rules: dict[str, Any], enabled: bool = True) -> LintPolicy:
    return LintPolicy(name, priority, enabled, rules)


SHADOW_CASES = [
    pytest.param(
        [policy("deny-all", 100, deny("*")), policy("low", 10, allow("payments.refund"))],
        [Shadow("low", 0, (("deny-all", 100),))],
        id="denylist-star",
    ),
    pytest.param(
        [policy("deny-all", 100, deny()), policy("low", 10, rule("rate_limit"))],
        [Shadow("low", 0, (("deny-all", 100),))],
        id="denylist-tools-omitted-vs-omitted",
    ),
    pytest.param(
        [
            policy("payments", 50, allow("payments.*")),
            policy("low", 10, deny("payments.refund", "payments.charge?")),
        ],
        [Shadow("low", 0, (("payments", 50),))],
        id="allowlist-covers-tools",
    ),
    pytest.param(
        [policy("a", 10, deny("*")), policy("b", 10, allow("payments.refund"))],
        [],
        id="equal-priority-not-shadowed",
    ),
    pytest.param(
        [policy("off", 100, deny("*"), enabled=False), policy("low", 10, allow("x"))],
        [],
        id="higher-disabled-not-shadowed",
    ),
    pytest.param(
        [policy("deny-all", 100, deny("*")), policy("off", 10, allow("x"), enabled=False)],
        [],
        id="lower-disabled-not-reported",
    ),
    pytest.param(
        [policy("payments", 100, deny("payments.*")), policy("low", 10, allow())],
        [],
        id="partial-cover-not-shadowed",
    ),
    pytest.param(
        [policy("payments", 100, deny("payments.*")), policy("low", 10, allow("pay*"))],
        [],
        id="partial-cover-glob-not-shadowed",
    ),
    pytest.param(
        [
            policy("payments", 100, deny("payments.*")),
            policy("email", 90, allow("email.*")),
            policy("low", 10, allow("payments.refund", "email.send")),
        ],
        [Shadow("low", 0, (("email", 90), ("payments", 100)))],
        id="union-of-two-policies",
    ),
    pytest.param(
        [
            policy("payments", 100, deny("payments.*")),
            policy("email", 90, allow("email.*")),
            policy("low", 10, allow("payments.refund", "sms.send")),
        ],
        [],
        id="union-missing-one-tool",
    ),
    pytest.param(
        [
            policy("both", 100, deny("payments.*"), allow("email.*")),
            policy("low", 10, rule("time_based", "payments.refund", "email.send")),
        ],
        [Shadow("low", 0, (("both", 100),))],
        id="union-of-two-rules-of-one-policy",
    ),
    pytest.param(
        [policy("db", 100, allow("db.*.read")), policy("low", 10, deny("db.users?.read"))],
        [Shadow("low", 0, (("db", 100),))],
        id="glob-question-mark-and-dots",
    ),
    pytest.param(
        [policy("tools", 100, allow("tool?")), policy("low", 10, deny("tool.", "toolx"))],
        [Shadow("low", 0, (("tools", 100),))],
        id="question-mark-matches-a-dot",
    ),
    pytest.param(
        [policy("reads", 100, allow("*.read")), policy("low", 10, deny("db.*"))],
        [],
        id="suffix-does-not-cover-prefix",
    ),
    pytest.param(
        [policy("one", 100, allow("a.?")), policy("low", 10, deny("a.*"))],
        [],
        id="question-mark-does-not-cover-star",
    ),
    pytest.param(
        [
            policy("checks", 100, rule("parameter_constraint"), rule("time_based")),
            policy("limits", 90, rule("rate_limit")),
            policy("low", 10, allow("payments.refund")),
        ],
        [],
        id="constraint-only-policies-do-not-decide",
    ),
    pytest.param(
        [
            policy("checked", 100, rule("parameter_constraint"), allow("payments.*")),
            policy("low", 10, allow("payments.refund")),
        ],
        [Shadow("low", 0, (("checked", 100),))],
        id="constraint-with-allowlist-decides",
    ),
    pytest.param(
        [
            policy("deny-all", 100, deny()),
            policy("payments", 50, allow("payments.*"), deny("shell.exec")),
            policy("low", 10, allow("payments.refund"), allow("x")),
        ],
        [
            Shadow("low", 0, (("deny-all", 100),)),
            Shadow("low", 1, (("deny-all", 100),)),
            Shadow("payments", 0, (("deny-all", 100),)),
            Shadow("payments", 1, (("deny-all", 100),)),
        ],
        id="highest-covering-policy-named-sorted-output",
    ),
    pytest.param(
        [
            policy("payments", 100, allow("payments.*")),
            policy("low", 10, allow("payments.refund"), deny("shell.exec"), allow()),
        ],
        [Shadow("low", 0, (("payments", 100),))],
        id="only-covered-rules-reported",
    ),
    pytest.param(
        [
            policy("exact", 100, allow("a")),
            policy("longer", 100, allow("a?*")),
            policy("low", 10, deny("a*")),
        ],
        [],  # documented limitation: no pattern is covered by a union of patterns
        id="union-of-patterns-for-one-pattern-not-found",
    ),
    pytest.param([], [], id="no-policies"),
]


@pytest.mark.parametrize(("policies", "expected"), SHADOW_CASES)
def test_shadowed_rules(policies, expected):
    assert shadowed_rules(policies) == expected


@pytest.mark.parametrize(
    ("shadow", "message"),
    [
        pytest.param(
            Shadow("low", 0, (("deny-payments", 100),)),
            "never reached: policy 'deny-payments' (priority 100) always decides these tools first",
            id="one-policy",
        ),
        pytest.param(
            Shadow("low", 0, (("a", 3), ("b", 2), ("c", 1))),
            "never reached: policies 'a' (priority 3), 'b' (priority 2) and 'c' (priority 1) "
            "together always decide these tools first",
            id="several-policies",
        ),
    ],
)
def test_shadow_message(shadow, message):
    assert shadow_message(shadow) == message


@pytest.mark.parametrize(
    ("general", "specific", "covers"),
    [
        pytest.param("*", "anything.at.all", True, id="star-covers-literal"),
        pytest.param("*", "*", True, id="star-covers-star"),
        pytest.param("payments.*", "payments.refund", True, id="prefix-covers-literal"),
        pytest.param("payments.*", "payments.re*", True, id="prefix-covers-longer-prefix"),
        pytest.param("payments.*", "payments*", False, id="prefix-not-shorter-prefix"),
        pytest.param("Payments.*", "payments.x", False, id="case-sensitive"),
        pytest.param("*a*", "a*", True, id="infix-covers-prefix"),
        pytest.param("a*", "*a*", False, id="prefix-not-infix"),
        pytest.param("*?", "?*", True, id="star-question-covers-question-star"),
        pytest.param("?*", "*", True, id="names-are-never-empty"),
        pytest.param("??*", "*", False, id="one-character-names-exist"),
        pytest.param("*a?*", "*ab*", True, id="question-covers-literal"),
        pytest.param("*.*", "a?b", False, id="question-is-not-only-a-dot"),
        pytest.param("*a*b*", "*ab*", True, id="two-infixes-cover-one"),
        pytest.param("*ab*", "*a*b*", False, id="one-infix-not-two"),
        pytest.param("a", "a*", False, id="literal-not-prefix"),
        pytest.param("a?*", "a*", False, id="union-with-a-is-not-found-alone"),
        pytest.param("[ab]", "[ab]", True, id="brackets-are-literal"),
        pytest.param("*a" + "?" * 20 + "*", "*a" + "?" * 21 + "*", True, id="long-runs"),
    ],
)
def test_glob_covers(general, specific, covers):
    assert glob_covers(general, specific) is covers


def test_glob_covers_gives_up_soundly():
    """``*a?{k}*?`` covers ``*a?{k+1}*``, but the search needs about 2**k sets of positions:
    past its limit the answer is False (never a coverage that might not hold), and quick."""
    assert glob_covers("*a???*?", "*a????*")
    assert not glob_covers("*a" + "?" * 15 + "*?", "*a" + "?" * 16 + "*")


PATTERNS = st.text(alphabet="ab.*?", max_size=5)
# names up to 6 characters; "c" stands for every character neither pattern holds
NAMES = ["".join(chars) for n in range(1, 7) for chars in itertools.product("ab.c", repeat=n)]


@settings(max_examples=400, deadline=None)
@given(general=PATTERNS, specific=PATTERNS)
def test_glob_covers_agrees_with_brute_force(general, specific):
    """Sound: a claimed coverage holds on every short name. Complete: when no short name is
    a counterexample, coverage is claimed (for patterns this short, 6 characters always
    suffice to show a counterexample; checked exhaustively up to length 4 against 8)."""
    in_general, in_specific = compile_glob(general), compile_glob(specific)
    counterexamples = [n for n in NAMES if in_specific(n) and not in_general(n)]
    assert glob_covers(general, specific) == (not counterexamples), counterexamples[:3]


@settings(max_examples=400, deadline=None)
@given(general=PATTERNS.map(lambda p: "*" + p), specific=PATTERNS)
def test_glob_covers_agrees_with_brute_force_for_star_patterns(general, specific):
    """As above, biased to general patterns starting with a star, where coverage is common."""
    in_general, in_specific = compile_glob(general), compile_glob(specific)
    counterexamples = [n for n in NAMES if in_specific(n) and not in_general(n)]
    assert glob_covers(general, specific) == (not counterexamples), counterexamples[:3]


# --- against the engine -------------------------------------------------------------------

TOOL_PATTERNS = st.sampled_from(["*", "a*", "a.*", "*b", "a?", "?.b", "a.b", "b", "*.*", "ab"])
RULES = st.builds(
    lambda kind, tools: rule(kind, *tools),
    st.sampled_from(["tool_allowlist", "tool_denylist", "parameter_constraint", "time_based"]),
    st.lists(TOOL_PATTERNS, max_size=2),
)
POLICIES = st.lists(
    st.tuples(st.integers(0, 2), st.booleans(), st.lists(RULES, min_size=1, max_size=3)),
    max_size=4,
)
TOOLS = ["".join(chars) for n in range(1, 4) for chars in itertools.product("ab.c", repeat=n)]


def _decisions(policies: list[LintPolicy]) -> list[tuple[bool, str | None, int | None]]:
    compiled = order_policies(
        compile_policy(
            id=p.name,
            name=p.name,
            priority=p.priority,
            enabled=p.enabled,
            created_at=NOW,
            rules=p.rules,
        )
        for p in policies
    )
    calls = [(tool, parameters) for tool in TOOLS for parameters in ({}, {"amount": 5})]
    out = []
    for tool, parameters in calls:
        decision = settle(evaluate(compiled, tool, parameters, NOW), MemoryCounters())
        out.append((decision.allowed, decision.policy_id, decision.rule_index))
    return out


def _replace(policies, shadow, new_rule):
    return [
        LintPolicy(
            p.name,
            p.priority,
            p.enabled,
            [
                new_rule if (p.name, i) == (shadow.policy, shadow.rule_index) else r
                for i, r in enumerate(p.rules)
            ],
        )
        for p in policies
    ]


@settings(max_examples=150, deadline=None)
@given(POLICIES)
def test_shadowed_rules_never_change_a_decision(specs):
    """A rule reported as never reached decides nothing: as an allowlist or as a denylist
    of the same tools, every call gets the same decision."""
    policies = [
        policy(f"p{n}", prio, *rules, enabled=on) for n, (prio, on, rules) in enumerate(specs)
    ]
    for shadow in shadowed_rules(policies):
        tools = policies[int(shadow.policy[1:])].rules[shadow.rule_index].get("tools", [])
        as_allow = _decisions(_replace(policies, shadow, allow(*tools)))
        as_deny = _decisions(_replace(policies, shadow, deny(*tools)))
        assert as_allow == as_deny
