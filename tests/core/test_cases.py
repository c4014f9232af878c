"""Runs every authorization case in ``tests/cases/*.yaml`` through the engine.

A file is either a list of cases or a mapping with shared ``policies`` and ``now`` plus
``cases``. A case::

    name: unique within its file (the test id is ``<file>:<name>``)
    why: optional, what the case shows
    policies: [{name, id?, priority?, enabled?, createdAt?, rules}]  (else the file's)
    now: ISO 8601 instant with an offset (else the file's)
    tool: tool name;  parameters: object (default {});  sessionId: optional session id
    agentStatus: optional active | suspended | revoked;  agentExists: optional, false
    expect: {allowed, policy: name or null, ruleIndex: int or null,
             reason?: substring, reasonExcludes?: [substrings], retryAfterSeconds?: int,
             outcome?: allowed | denied | escalated (else as allowed says),
             approval?: a label, or null for none}
    calls: optional list of {now?, tool?, parameters?, sessionId?, expect}, run in order against one
           MemoryCounters (rate-limit windows) and one MemoryApprovals; a call inherits what it
           leaves out from the case. A step {now?, decide: {approval: label, as: approved |
           denied, ok?: false}} decides an approval instead of making a call.

An approval label names the approval of the first decision that shows it; later decisions
with the same label must carry the same approval, and two labels never name one approval.

Policy defaults mirror the API (priority 0, enabled true); ``id`` defaults to the name.
Every policy's rules are first checked against the JSON Schema contract, so a case can only
hold rules the API would accept.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from core.domain.approvals import MemoryApprovals
from core.domain.compiler import compile_policy
from core.domain.engine import (
    CompiledPolicy,
    Decision,
    deny_agent_status,
    deny_unknown_agent,
    evaluate,
    order_policies,
    settle,
)
from core.domain.limits import MemoryCounters
from core.domain.rules import check_rules
from schemas import validate

CASES = Path(__file__).resolve().parent.parent / "cases"
FILE_KEYS = {"policies", "now", "cases"}
CASE_KEYS = {"name", "why", "policies", "now", "tool", "parameters", "sessionId", "agentStatus"}
CASE_KEYS |= {"agentExists", "expect", "calls"}
CALL_KEYS = {"now", "tool", "parameters", "sessionId", "expect", "why", "decide"}
POLICY_KEYS = {"name", "id", "priority", "enabled", "createdAt", "rules"}
EXPECT_KEYS = {"allowed", "policy", "ruleIndex", "reason", "reasonExcludes", "retryAfterSeconds"}
EXPECT_KEYS |= {"outcome", "approval"}
UNKNOWN_AGENT = "00000000-0000-4000-8000-000000000000"
DEFAULT_CREATED = "2026-01-01T00:00:00+00:00"


def load_cases() -> list[Any]:
    params = []
    for path in sorted(CASES.glob("*.yaml")):
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
        shared = document if isinstance(document, dict) else {"cases": document}
        assert set(shared) <= FILE_KEYS, f"{path.name}: unknown keys {set(shared) - FILE_KEYS}"
        for case in shared["cases"]:
            params.append(pytest.param(shared, case, id=f"{path.stem}:{case['name']}"))
    return params


ALL_CASES = load_cases()


def test_case_ids_are_unique_and_plentiful() -> None:
    ids = [param.id for param in ALL_CASES]
    assert len(ids) == len(set(ids))
    assert len(ids) >= 80


@pytest.mark.parametrize(("shared", "case"), ALL_CASES)
def test_case(shared: Mapping[str, Any], case: Mapping[str, Any]) -> None:
    assert set(case) <= CASE_KEYS, f"unknown case keys {set(case) - CASE_KEYS}"
    raw_policies = case.get("policies", shared.get("policies"))
    assert raw_policies is not None, "a case needs policies, its own or its file's"
    policies = order_policies(compile_case_policy(raw) for raw in raw_policies)
    ids = {raw["name"]: str(raw.get("id", raw["name"])) for raw in raw_policies}
    counters, approvals = MemoryCounters(), MemoryApprovals()
    labels: dict[str, str] = {}
    for step, call in enumerate(case_calls(case, shared)):
        if "decide" in call:
            decide_approval(call, approvals, labels, f"step {step}")
            continue
        decision = decide(case, call, policies, counters, approvals)
        check(decision, call["expect"], ids, labels, f"call {step}")


def compile_case_policy(raw: Mapping[str, Any]) -> CompiledPolicy:
    assert set(raw) <= POLICY_KEYS, f"unknown policy keys {set(raw) - POLICY_KEYS}"
    problems = validate("policy.json#/$defs/rules", raw["rules"]) + check_rules(raw["rules"])
    assert not problems, f"policy {raw['name']!r} breaks the contract: {problems}"
    return compile_policy(
        id=str(raw.get("id", raw["name"])),
        name=raw["name"],
        priority=raw.get("priority", 0),
        enabled=raw.get("enabled", True),
        created_at=parse_instant(raw.get("createdAt", DEFAULT_CREATED)),
        rules=raw["rules"],
    )


def case_calls(case: Mapping[str, Any], shared: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    base = {"now": case.get("now", shared.get("now")), "tool": case.get("tool")}
    base["parameters"] = case.get("parameters", {})
    base["sessionId"] = case.get("sessionId")
    if "calls" not in case:
        yield {**base, "expect": case["expect"]}
        return
    assert "expect" not in case, "a case has either expect or calls"
    for call in case["calls"]:
        assert set(call) <= CALL_KEYS, f"unknown call keys {set(call) - CALL_KEYS}"
        yield {**base, **call}


def decide_approval(
    step: Mapping[str, Any], approvals: MemoryApprovals, labels: Mapping[str, str], at: str
) -> None:
    decide = step["decide"]
    assert "expect" not in step, at
    assert set(decide) <= {"approval", "as", "ok"}, at
    assert decide["as"] in ("approved", "denied"), at
    now = parse_instant(step["now"])
    done = approvals.decide(labels[decide["approval"]], decide["as"] == "approved", now)
    assert done == decide.get("ok", True), f"{at}: deciding gave {done}"


def decide(
    case: Mapping[str, Any],
    call: Mapping[str, Any],
    policies: list[CompiledPolicy],
    counters: MemoryCounters,
    approvals: MemoryApprovals,
) -> Decision:
    if case.get("agentExists", True) is False:
        return deny_unknown_agent(UNKNOWN_AGENT)
    status = case.get("agentStatus", "active")
    if status != "active":
        return deny_agent_status(status)
    assert call["now"] is not None, "a call needs now, its own or its case's or its file's"
    assert call["tool"] is not None, "a call needs a tool, its own or its case's"
    now = parse_instant(call["now"])
    evaluated = evaluate(policies, call["tool"], call["parameters"], now, call["sessionId"])
    return settle(evaluated, counters, approvals.for_call(call["tool"], call["parameters"]))


def check(
    decision: Decision,
    expect: Mapping[str, Any],
    ids: Mapping[str, str],
    labels: dict[str, str],
    at: str,
) -> None:
    assert set(expect) <= EXPECT_KEYS, f"unknown expect keys {set(expect) - EXPECT_KEYS}"
    assert {"allowed", "policy", "ruleIndex"} <= set(expect), "expect needs those three keys"
    policy = expect["policy"]
    got = (decision.allowed, decision.policy_id, decision.rule_index, decision.retry_after_seconds)
    wanted = (
        expect["allowed"],
        None if policy is None else ids[policy],
        expect["ruleIndex"],
        expect.get("retryAfterSeconds"),
    )
    assert got == wanted, f"{at}: got {got} ({decision.reason!r}), expected {wanted}"
    outcome = expect.get("outcome", "allowed" if expect["allowed"] else "denied")
    assert decision.outcome == outcome, f"{at}: outcome {decision.outcome} ({decision.reason!r})"
    assert (decision.approval_expires_at is not None) == (outcome == "escalated"), at
    if "approval" in expect:
        check_approval(decision.approval_id, expect["approval"], labels, at)
    assert expect.get("reason", "") in decision.reason, f"{at}: reason {decision.reason!r}"
    for secret in expect.get("reasonExcludes", ()):
        assert secret not in decision.reason, f"{at}: reason leaks {secret!r}"


def check_approval(found: str | None, label: str | None, labels: dict[str, str], at: str) -> None:
    if label is None:
        assert found is None, f"{at}: approval {found}, expected none"
        return
    assert found is not None, f"{at}: no approval, expected {label}"
    if label not in labels:
        assert found not in labels.values(), f"{at}: {label} is an approval already labelled"
        labels[label] = found
    assert found == labels[label], f"{at}: approval {found} is not {label}"


def parse_instant(text: str) -> datetime:
    assert isinstance(text, str), "quote instants in YAML so they stay strings"
    moment = datetime.fromisoformat(text)
    assert moment.tzinfo is not None, f"{text!r} needs an offset"
    return moment
