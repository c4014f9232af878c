"""Shadow and warn modes (decisions §10) through the API: a policy's ``mode``; the would-be
decision beside the real one, on the audit entry (``wouldBe``, ``hashVersion`` 2), in the
exports and in ``/metrics``; ``warnings`` for warn policies; the would-be limits' own counters,
the enforced ones read and never taken; no approval made; and a would-be decision that fails
(made to) leaving the real one as it is."""

from __future__ import annotations

import csv
import io
import json
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import httpx
import pytest

from api import create_app
from core.domain import modes
from tests.api.helpers import assert_error, decide, instant, make_agent
from tests.api.test_metrics import read as read_metrics
from tests.conftest import Tenant, bearer
from tests.server import running_server

ALLOW_ALL = [{"type": "tool_allowlist", "tools": ["*"]}]
DENY_REFUNDS = [{"type": "tool_denylist", "tools": ["payments.refund"]}]


def add_policy(
    client: Any,
    headers: Any,
    agent: str,
    rules: list[dict[str, Any]],
    mode: str | None = None,
    priority: int = 0,
    name: str | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "agent_id": agent, "name": name or f"{mode or 'enforce'}-{priority}", "rules": rules,
        "priority": priority,
    }  # fmt: skip
    if mode is not None:
        body["mode"] = mode
    response = client.post("/v1/policies", json=body, headers=headers)
    assert response.status_code == 201, response.get_data(as_text=True)
    return dict(response.json)


def entry_of(client: Any, headers: Any, agent: str, audit_id: str) -> dict[str, Any]:
    """The audit entry ``audit_id`` of the agent, as the list answers it."""
    listed = client.get(
        "/v1/audit-logs", query_string={"agent_id": agent, "limit": 1000}, headers=headers
    )
    assert listed.status_code == 200
    [found] = [e for e in listed.json["data"] if e["id"] == audit_id]
    return dict(found)


def shadowed_agent(client: Any, headers: Any, mode: str = "shadow") -> tuple[str, dict[str, Any]]:
    """An agent allowed every tool, with a ``mode`` policy that would deny payments.refund
    (above the allow, by priority); the agent's id and that policy."""
    agent = make_agent(client, headers, f"agent-{mode}", ALLOW_ALL)
    return agent, add_policy(client, headers, agent, DENY_REFUNDS, mode, priority=10)


# ------------------------------------------------------------------------------ the mode


def test_a_policy_is_enforced_unless_it_says_otherwise(client, admin_headers):
    agent = make_agent(client, admin_headers)
    created = add_policy(client, admin_headers, agent, ALLOW_ALL)
    assert created["mode"] == "enforce"
    assert client.get(f"/v1/policies/{created['id']}", headers=admin_headers).json["mode"] == (
        "enforce"
    )


@pytest.mark.parametrize("mode", ["enforce", "warn", "shadow"])
def test_the_mode_is_taken_on_create_and_on_update(client, admin_headers, mode):
    agent = make_agent(client, admin_headers)
    created = add_policy(client, admin_headers, agent, ALLOW_ALL, mode)
    assert created["mode"] == mode
    other = "shadow" if mode != "shadow" else "warn"
    patched = client.patch(
        f"/v1/policies/{created['id']}", json={"mode": other}, headers=admin_headers
    )
    assert patched.status_code == 200
    assert patched.json["mode"] == other
    listed = client.get("/v1/policies", query_string={"agent_id": agent}, headers=admin_headers)
    assert [p["mode"] for p in listed.json["data"]] == [other]


@pytest.mark.parametrize("bad", ["audit", "SHADOW", "", None, 1, True])
def test_an_unknown_mode_is_refused_and_changes_nothing(client, admin_headers, bad):
    agent = make_agent(client, admin_headers)
    body = {"agent_id": agent, "name": "p", "rules": ALLOW_ALL, "mode": bad}
    response = client.post("/v1/policies", json=body, headers=admin_headers)
    assert_error(response, 400, "VALIDATION_ERROR")
    created = add_policy(client, admin_headers, agent, ALLOW_ALL, "shadow")
    response = client.patch(
        f"/v1/policies/{created['id']}", json={"mode": bad}, headers=admin_headers
    )
    assert_error(response, 400, "VALIDATION_ERROR")
    listed = client.get("/v1/policies", query_string={"agent_id": agent}, headers=admin_headers)
    assert [p["mode"] for p in listed.json["data"]] == ["shadow"]


# ------------------------------------------------------------------- who decides, and how


def test_only_enforced_policies_decide_a_call(client, admin_headers):
    warned = make_agent(client, admin_headers, "warned")
    warn = add_policy(client, admin_headers, warned, ALLOW_ALL, "warn")
    decision = decide(client, admin_headers, warned, "calendar.read")
    assert (decision["allowed"], decision["policyId"]) == (False, None)  # the default deny
    assert decision["warnings"] == [
        {
            "policyId": warn["id"],
            "result": "allowed",
            "reason": "allowed by policy 'warn-0' rule 0 (tool_allowlist)",
        }
    ]
    shadowed = make_agent(client, admin_headers, "shadowed")
    add_policy(client, admin_headers, shadowed, ALLOW_ALL, "shadow")
    decision = decide(client, admin_headers, shadowed, "calendar.read")
    assert (decision["allowed"], decision["warnings"]) == (False, [])


def test_a_shadow_policy_records_what_it_would_do_and_says_nothing(client, admin_headers):
    agent, shadow = shadowed_agent(client, admin_headers, "shadow")
    decision = decide(client, admin_headers, agent, "payments.refund", amount=5)
    assert (decision["allowed"], decision["warnings"]) == (True, [])
    entry = entry_of(client, admin_headers, agent, decision["auditId"])
    assert entry["result"] == "allowed"
    assert entry["hashVersion"] == 2
    assert entry["wouldBe"] == {
        "result": "denied",
        "policyId": shadow["id"],
        "ruleIndex": 0,
        "reason": "denied by policy 'shadow-10' rule 0 (tool_denylist): tool 'payments.refund' "
        "is denied",
    }


def test_a_warn_policy_warns_the_caller_when_it_would_decide_otherwise(client, admin_headers):
    agent, warn = shadowed_agent(client, admin_headers, "warn")
    decision = decide(client, admin_headers, agent, "payments.refund", amount=5)
    assert decision["allowed"] is True  # the real decision is followed
    entry = entry_of(client, admin_headers, agent, decision["auditId"])
    assert decision["warnings"] == [
        {"policyId": warn["id"], "result": "denied", "reason": entry["wouldBe"]["reason"]}
    ]
    assert entry["wouldBe"]["result"] == "denied"


def test_a_warn_policy_that_agrees_or_does_not_decide_says_nothing(client, admin_headers):
    agent, _ = shadowed_agent(client, admin_headers, "warn")
    other = decide(client, admin_headers, agent, "calendar.read")  # the warn policy's out of scope
    assert (other["allowed"], other["warnings"]) == (True, [])
    entry = entry_of(client, admin_headers, agent, other["auditId"])
    assert entry["wouldBe"]["result"] == "allowed"
    assert entry["wouldBe"]["policyId"] == other["policyId"]  # the enforced allow decides both


def test_an_agent_without_warn_or_shadow_policies_has_no_would_be_decision(client, admin_headers):
    agent = make_agent(client, admin_headers, "plain", ALLOW_ALL)
    disabled = add_policy(client, admin_headers, agent, DENY_REFUNDS, "shadow", priority=10)
    client.patch(f"/v1/policies/{disabled['id']}", json={"enabled": False}, headers=admin_headers)
    decision = decide(client, admin_headers, agent, "payments.refund")
    assert decision["warnings"] == []
    entry = entry_of(client, admin_headers, agent, decision["auditId"])
    assert (entry["wouldBe"], entry["hashVersion"]) == (None, 2)


def test_a_suspended_agent_s_would_be_decision_is_its_deny(client, admin_headers):
    agent, _ = shadowed_agent(client, admin_headers, "shadow")
    client.patch(f"/v1/agents/{agent}", json={"status": "suspended"}, headers=admin_headers)
    decision = decide(client, admin_headers, agent, "payments.refund")
    assert decision["allowed"] is False
    entry = entry_of(client, admin_headers, agent, decision["auditId"])
    assert entry["wouldBe"] == {
        "result": "denied", "policyId": None, "ruleIndex": None, "reason": "agent is suspended",
    }  # fmt: skip


# --------------------------------------------------------------------------- their limits


def test_a_shadow_limit_keeps_its_own_count_and_the_real_calls_go_on(client, admin_headers):
    agent = make_agent(client, admin_headers, "limited")
    add_policy(client, admin_headers, agent, ALLOW_ALL)  # no enforced limit at all
    shadow_rules = [
        {"type": "rate_limit", "rateLimit": {"maxCalls": 2, "windowSeconds": 3600}},
        {"type": "tool_allowlist", "tools": ["*"]},
    ]
    add_policy(client, admin_headers, agent, shadow_rules, "shadow", priority=10)
    decisions = [decide(client, admin_headers, agent, "search.web") for _ in range(4)]
    assert [d["allowed"] for d in decisions] == [True] * 4
    would = [entry_of(client, admin_headers, agent, d["auditId"])["wouldBe"] for d in decisions]
    assert [w["result"] for w in would] == ["allowed", "allowed", "denied", "denied"]
    assert "rate limit of 2 calls per 3600 seconds exceeded" in would[2]["reason"]


def test_an_enforced_limit_is_read_by_the_would_be_decision_and_never_taken(client, admin_headers):
    agent = make_agent(client, admin_headers, "enforced-limit")
    enforced = [
        {"type": "rate_limit", "rateLimit": {"maxCalls": 3, "windowSeconds": 3600}},
        {"type": "tool_allowlist", "tools": ["*"]},
    ]
    add_policy(client, admin_headers, agent, enforced)
    # a shadow policy that decides nothing for search.web: the enforced one decides both
    add_policy(client, admin_headers, agent, DENY_REFUNDS, "shadow", priority=10)
    decisions = [decide(client, admin_headers, agent, "search.web") for _ in range(5)]
    # three grants, not fewer: the would-be decisions took nothing of the enforced counter
    assert [d["allowed"] for d in decisions] == [True, True, True, False, False]
    would = [entry_of(client, admin_headers, agent, d["auditId"])["wouldBe"] for d in decisions]
    # each read the counter as it stood before its call
    assert [w["result"] for w in would] == ["allowed", "allowed", "allowed", "denied", "denied"]


def test_a_mode_change_starts_the_policy_s_counters_afresh(client, admin_headers):
    agent = make_agent(client, admin_headers, "promoted")
    add_policy(client, admin_headers, agent, ALLOW_ALL)
    rules = [
        {"type": "rate_limit", "rateLimit": {"maxCalls": 1, "windowSeconds": 3600}},
        {"type": "tool_allowlist", "tools": ["*"]},
    ]
    limited = add_policy(client, admin_headers, agent, rules, "shadow", priority=10)
    first, second = (decide(client, admin_headers, agent, "search.web") for _ in range(2))
    assert entry_of(client, admin_headers, agent, second["auditId"])["wouldBe"]["result"] == (
        "denied"
    )
    patched = client.patch(
        f"/v1/policies/{limited['id']}", json={"mode": "enforce"}, headers=admin_headers
    )
    assert patched.status_code == 200
    # enforced now, with an empty counter: one call more is allowed, then none
    assert [decide(client, admin_headers, agent, "search.web")["allowed"] for _ in range(2)] == [
        True,
        False,
    ]
    assert (first["allowed"], second["allowed"]) == (True, True)


def test_a_shadow_approval_rule_makes_the_would_be_decision_escalated_and_asks_no_one(
    client, admin_headers
):
    agent = make_agent(client, admin_headers, "approver", ALLOW_ALL)
    ask = [{"type": "require_approval", "tools": ["payments.*"]}, *ALLOW_ALL]
    shadow = add_policy(client, admin_headers, agent, ask, "shadow", priority=10)
    decision = decide(client, admin_headers, agent, "payments.refund", amount=5)
    assert (decision["allowed"], decision["approvalId"]) == (True, None)
    would = entry_of(client, admin_headers, agent, decision["auditId"])["wouldBe"]
    assert (would["result"], would["policyId"], would["ruleIndex"]) == (
        "escalated", shadow["id"], 0,
    )  # fmt: skip
    approvals = client.get("/v1/approvals", headers=admin_headers)
    assert approvals.status_code == 200
    assert approvals.json["data"] == []


# ------------------------------------------------------------------ a would-be that fails


def test_a_would_be_decision_that_fails_is_recorded_as_error_and_the_real_one_stands(
    client, admin_headers, monkeypatch
):
    agent = make_agent(client, admin_headers, "failing", ALLOW_ALL)
    rules = [
        {"type": "rate_limit", "rateLimit": {"maxCalls": 5, "windowSeconds": 3600}},
        {"type": "tool_allowlist", "tools": ["*"]},
    ]
    add_policy(client, admin_headers, agent, rules, "warn", priority=10)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("injected: the would-be decision fails")

    before = read_metrics(client)
    monkeypatch.setattr(modes.Trial, "settle", broken)  # in the batch, after the real one
    settled = decide(client, admin_headers, agent, "search.web")
    monkeypatch.undo()
    monkeypatch.setattr(modes.Trial, "decided", property(broken))  # before the batch
    off_lock = decide(client, admin_headers, agent, "payments.refund")
    monkeypatch.undo()
    for decision in (settled, off_lock):
        assert (decision["allowed"], decision["warnings"]) == (True, [])
        entry = entry_of(client, admin_headers, agent, decision["auditId"])
        assert entry["result"] == "allowed"
        assert entry["wouldBe"] == {
            "result": "error", "policyId": None, "ruleIndex": None,
            "reason": modes.ERROR_REASON,
        }  # fmt: skip
    after = read_metrics(client)
    errors = ("agentauth_would_be_decisions_total", (("policy_id", ""), ("result", "error")))
    assert after[errors] - before.get(errors, 0) == 2
    # the failed one took nothing: the warn limit of 5 still grants 5 would-be decisions
    later = [decide(client, admin_headers, agent, "search.web") for _ in range(6)]
    would = [entry_of(client, admin_headers, agent, d["auditId"])["wouldBe"] for d in later]
    assert [w["result"] for w in would] == ["allowed"] * 5 + ["denied"]


# ------------------------------------------------------------------ where it is written


def test_the_exports_carry_the_would_be_decision(client, admin_headers):
    agent, shadow = shadowed_agent(client, admin_headers, "shadow")
    refund = decide(client, admin_headers, agent, "payments.refund")
    jsonl = client.get(
        "/v1/audit-logs/export", query_string={"format": "jsonl"}, headers=admin_headers
    )
    lines = [json.loads(line) for line in jsonl.get_data(as_text=True).splitlines() if line]
    [line] = [line for line in lines if line.get("id") == refund["auditId"]]
    assert (line["hashVersion"], line["wouldBe"]["result"]) == (2, "denied")
    assert line["wouldBe"]["policyId"] == shadow["id"]
    text = client.get(
        "/v1/audit-logs/export", query_string={"agent_id": agent}, headers=admin_headers
    ).get_data(as_text=True)
    [row] = list(csv.DictReader(io.StringIO(text)))
    assert (row["Would-be result"], row["Would-be policy ID"]) == ("denied", shadow["id"])
    assert row["Would-be reason"] == line["wouldBe"]["reason"]


def test_metrics_count_would_be_decisions_by_policy_and_result(client, admin_headers):
    agent, shadow = shadowed_agent(client, admin_headers, "shadow")
    before = read_metrics(client)
    for tool in ("payments.refund", "payments.refund", "calendar.read"):
        decide(client, admin_headers, agent, tool)
    after = read_metrics(client)
    name = "agentauth_would_be_decisions_total"
    denied = (name, (("policy_id", shadow["id"]), ("result", "denied")))
    assert after[denied] - before.get(denied, 0) == 2
    allowed = [
        after[key] - before.get(key, 0)
        for key in after
        if key[0] == name and dict(key[1])["result"] == "allowed"
    ]
    assert sum(allowed) == 1


# ------------------------------------------------------------- two servers, one counter


CALLS, CLIENTS, SHADOW_MAX, WINDOW = 12, 4, 10, 86400


def _calls(base: str, key: str, agent: str) -> list[str]:
    body = {"agent_id": agent, "tool_name": "search.web", "parameters": {}}
    with httpx.Client(base_url=base, headers=bearer(key), timeout=60) as http:
        out = []
        for _ in range(CALLS):
            response = http.post("/v1/authorize", json=body)
            assert response.status_code == 200, response.text
            assert response.json()["allowed"] is True
            out.append(response.json()["auditId"])
        return out


@pytest.mark.slow
def test_shadow_limits_are_exact_across_server_processes_and_leave_the_enforced_ones_alone(
    database_url, settings, clock
):
    app = create_app(settings)
    tenant = Tenant(app, f"shadow-limits-{clock.moment.timestamp()}", clock)
    key = tenant.key("admin")
    client, headers = app.test_client(), bearer(key)
    agent = make_agent(client, headers, "busy")
    enforced = [
        {"type": "rate_limit", "rateLimit": {"maxCalls": 1000, "windowSeconds": WINDOW}},
        {"type": "tool_allowlist", "tools": ["*"]},
    ]
    real = add_policy(client, headers, agent, enforced)
    shadow = [
        {"type": "rate_limit", "rateLimit": {"maxCalls": SHADOW_MAX, "windowSeconds": WINDOW}},
        {"type": "tool_allowlist", "tools": ["*"]},
    ]
    trial = add_policy(client, headers, agent, shadow, "shadow", priority=10)
    env = {"AGENTAUTH_RATE_LIMIT_PER_MINUTE": "100000"}
    with (
        running_server(database_url, workers=2, threads=4, env=env) as base,
        ProcessPoolExecutor(max_workers=CLIENTS) as pool,
    ):
        futures = [pool.submit(_calls, base, key, agent) for _ in range(CLIENTS)]
        ids = [audit_id for future in futures for audit_id in future.result()]
    try:
        listed = client.get(
            "/v1/audit-logs", query_string={"agent_id": agent, "limit": 1000}, headers=headers
        ).json["data"]
        used = client.get(f"/v1/agents/{agent}/usage", headers=headers).json["data"]
    finally:
        app.extensions["agentauth"].close()
    assert sorted(e["id"] for e in listed) == sorted(ids)
    # the calls may straddle two windows: each is judged apart
    windows: dict[int, list[str]] = {}
    for entry in listed:
        window = int(instant(entry["timestamp"]).timestamp()) // WINDOW * WINDOW
        windows.setdefault(window, []).append(entry["wouldBe"]["result"])
    for results in windows.values():
        assert results.count("allowed") == min(len(results), SHADOW_MAX)
        assert results.count("denied") == len(results) - results.count("allowed")
    # the current window's counters: the enforced one took every real grant and no would-be
    # one, the shadow one exactly its would-be grants
    counters = {item["policyId"]: item for item in used}
    current = windows[int(instant(counters[real["id"]]["windowStart"]).timestamp())]
    assert counters[real["id"]]["used"] == len(current)
    assert counters[trial["id"]]["used"] == min(len(current), SHADOW_MAX)
