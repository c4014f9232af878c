"""Unit tests of core.domain.modes (decisions §10), pure: which policies decide which decision,
how a would-be grant takes only its own policies' counters and reads the enforced ones as they
stood, a would-be escalation that asks no one, the warning a warn policy gives, and peek's
windows, which must be the counters' own."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from core.domain.compiler import compile_policy
from core.domain.engine import CompiledPolicy, Decision, evaluate, order_policies, settle
from core.domain.limits import MemoryCounters
from core.domain.modes import ESCALATED, FAILED, PolicySet, Trial, WouldBe, peek

NOW = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
CREATED = datetime(2026, 1, 1, tzinfo=UTC)
ALLOW = {"type": "tool_allowlist"}


def limit(calls: int) -> dict[str, Any]:
    return {"type": "rate_limit", "rateLimit": {"maxCalls": calls, "windowSeconds": 3600}}


def policy(
    name: str, *rules: dict[str, Any], priority: int = 0, mode: str = "enforce"
) -> CompiledPolicy:
    return compile_policy(
        id=name, name=name, priority=priority, enabled=True, created_at=CREATED,
        rules=list(rules), mode=mode,
    )  # fmt: skip


def both(
    policies: list[CompiledPolicy], counters: MemoryCounters, tool: str = "search.web"
) -> tuple[Decision, WouldBe]:
    """The real decision and the would-be one, as the hot path settles them: the enforced
    counters read for the would-be decision first, then the real decision, then the trial."""
    ordered = PolicySet.of(order_policies(policies))
    assert ordered.every is not None
    trial = Trial(evaluate(ordered.every, tool, {}, NOW), ordered.warn_ids, ordered.trial_ids)
    refused = peek(trial.enforced_charges, NOW, lambda key: _stored(counters, key))
    real = settle(evaluate(ordered.enforced, tool, {}, NOW), counters)
    return real, trial.settle(real, refused, counters)


def _stored(counters: MemoryCounters, key: str) -> tuple[int, int] | None:
    return counters._windows.get(key)  # the in-memory counters' (window start, held)


def test_only_enforced_policies_decide_and_every_one_decides_the_would_be_decision():
    deny = {"type": "tool_denylist"}
    ordered = PolicySet.of(order_policies([
        policy("real", ALLOW), policy("tried", deny, priority=5, mode="shadow"),
        policy("loud", ALLOW, priority=1, mode="warn"),
    ]))  # fmt: skip
    assert [p.id for p in ordered.enforced] == ["real"]
    assert ordered.every is not None
    assert [p.id for p in ordered.every] == ["tried", "loud", "real"]
    assert (ordered.warn_ids, ordered.trial_ids) == ({"loud"}, {"tried", "loud"})
    assert PolicySet.of([policy("real", ALLOW)]).every is None  # nothing on trial


def test_a_trial_limit_is_taken_only_by_would_be_grants_and_never_by_the_real_decision():
    counters = MemoryCounters()
    policies = [policy("real", ALLOW), policy("tried", limit(2), ALLOW, priority=5, mode="shadow")]
    found = [both(policies, counters) for _ in range(3)]
    assert [real.allowed for real, _ in found] == [True, True, True]
    assert [would.result for _, would in found] == ["allowed", "allowed", "denied"]
    assert found[2][1].policy_id == "tried"
    assert counters.used(policies[1].rules[0].limit, NOW) == 2  # type: ignore[arg-type]


def test_an_enforced_limit_is_read_as_it_stood_before_the_call_and_never_taken_by_it():
    counters = MemoryCounters()
    policies = [policy("real", limit(2), ALLOW), policy("tried", {"type": "tool_denylist",
                "tools": ["other.*"]}, priority=5, mode="shadow")]  # fmt: skip
    found = [both(policies, counters) for _ in range(3)]
    assert [real.allowed for real, _ in found] == [True, True, False]
    assert [would.result for _, would in found] == ["allowed", "allowed", "denied"]
    assert counters.used(policies[0].rules[0].limit, NOW) == 2  # type: ignore[arg-type]


def test_a_would_be_escalation_asks_no_one_unless_the_real_decision_made_it():
    approval = {"type": "require_approval"}
    tried = [policy("real", ALLOW), policy("tried", approval, ALLOW, priority=5, mode="warn")]
    real, would = both(tried, MemoryCounters())
    assert real.allowed is True
    assert (would.result, would.policy_id, would.warn) == (ESCALATED, "tried", True)
    assert would.warning(real) == {"policyId": "tried", "result": "escalated",
                                   "reason": would.reason}  # fmt: skip
    # an enforced policy's escalation, settled by the real decision: the would-be is that one
    enforced = order_policies([policy("real", approval, ALLOW), policy("tried", {
        "type": "tool_denylist", "tools": ["other.*"]}, priority=5, mode="shadow")])  # fmt: skip
    ordered = PolicySet.of(enforced)
    assert ordered.every is not None
    trial = Trial(evaluate(ordered.every, "search.web", {}, NOW), frozenset(), ordered.trial_ids)
    made = Decision(True, "allowed by policy 'real' rule 0 (require_approval): approval a1 was "
                    "granted", "real", 0, approval_id="a1")  # fmt: skip
    assert trial.settle(made, None, MemoryCounters()) == WouldBe.of(made)


def test_a_warning_only_from_a_warn_policy_whose_result_differs():
    real = Decision(True, "allowed", "real", 0)
    assert WouldBe("denied", "loud", 0, "no", warn=True).warning(real) == {
        "policyId": "loud", "result": "denied", "reason": "no",
    }  # fmt: skip
    assert WouldBe("denied", "quiet", 0, "no").warning(real) is None  # shadow: silent
    assert WouldBe("allowed", "loud", 0, "yes", warn=True).warning(real) is None  # agrees
    assert FAILED.warning(real) is None


def test_peek_counts_in_the_window_the_counter_would_count_in():
    counters = MemoryCounters()
    ref = policy("p", limit(2), ALLOW).rules[0].limit
    assert ref is not None
    charge = ref.charge({}, None)
    assert not isinstance(charge, str)
    start = ref.window_start(NOW)
    assert peek([charge], NOW, lambda key: None) is None  # never used
    assert peek([charge], NOW, lambda key: (start, 1)) is None  # one left
    refused = peek([charge], NOW, lambda key: (start, 2))
    assert refused is not None
    assert (refused.used, refused.window_start) == (2, start)
    assert peek([charge], NOW, lambda key: (start - 3600, 2)) is None  # an old window
    later = peek([charge], NOW, lambda key: (start + 3600, 2))  # a later one, opened already
    assert later is not None
    assert later.window_start == start + 3600
    # and the same answers as the counters themselves give
    for _ in range(2):
        assert counters([charge], NOW) is None
    assert peek([charge], NOW, lambda key: _stored(counters, key)) == counters([charge], NOW)
    assert peek([charge], NOW + timedelta(hours=1), lambda key: _stored(counters, key)) is None
