"""Human approval over HTTP (decisions §6), as a user of the API sees it: the ``escalated``
decision and its audit entry; which calls share an approval (the parameters digest); the
Approval object; approving and denying (``/v1/approvals/:id/approve`` and ``/deny``) and what
the next identical calls get; who may decide (the ``approver`` scope, no self-approval); the
409, 404 and 400 answers; expiry with the fixed clock; the list's filters and paging; rate
limits taken only by the allowed call; deleting the agent; and single use when identical calls
come from many OS processes at once. The evaluation table itself is covered by the pure-engine
cases (tests/cases/approvals.yaml); the webhooks are not covered here."""

from __future__ import annotations

import hashlib
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import rfc8785

from core.config import Settings
from core.domain.redaction import MASK
from tests.api.helpers import assert_error, decide, instant
from tests.conftest import FakeClock, bearer

REFUND = "payments.refund"
#: rule 0 grants payments.*, rule 1 escalates refunds above 1,000: an allow that used an
#: approval (rule 1) is told apart from a plain grant (rule 0)
REFUNDS = [
    {"type": "tool_allowlist", "tools": ["payments.*"]},
    {"type": "require_approval", "tools": [REFUND], "parameters": {"amount": {"max": 1000}}},
]
APPROVAL_RULE = 1
DEFAULT_TTL = timedelta(seconds=3600)
APPROVAL_FIELDS = {
    "id", "agentId", "toolName", "parameters", "parametersDigest", "policyId", "ruleIndex",
    "status", "createdAt", "expiresAt", "decidedAt", "decidedBy", "comment", "usedAt",
    "requestedByKeyId",
}  # fmt: skip
DIGEST = re.compile(r"[0-9a-f]{64}")
STATUSES = ("pending", "approved", "denied", "expired", "used")


# --- helpers ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Key:
    """A key made through ``POST /v1/api-keys``, so its id and name are known."""

    id: str
    name: str
    headers: dict[str, str]


@dataclass(frozen=True)
class Refunds:
    agent_id: str
    policy_id: str


def new_key(client, admin_headers, name: str, *scopes: str) -> Key:
    body = {"name": name, "scopes": list(scopes)}
    response = client.post("/v1/api-keys", json=body, headers=admin_headers)
    assert response.status_code == 201, response.get_data(as_text=True)
    created = response.get_json()
    return Key(created["id"], name, bearer(created["key"]))


def new_agent(client, headers, rules: list[dict[str, Any]], name: str = "refunder") -> Refunds:
    agent = client.post("/v1/agents", json={"name": name}, headers=headers)
    assert agent.status_code == 201, agent.get_data(as_text=True)
    body = {"agent_id": agent.json["id"], "name": f"{name}-policy", "rules": rules}
    policy = client.post("/v1/policies", json=body, headers=headers)
    assert policy.status_code == 201, policy.get_data(as_text=True)
    return Refunds(agent.json["id"], policy.json["id"])


def escalate(client, headers, agent_id: str, tool: str = REFUND, **parameters: Any) -> Any:
    """A call that must escalate; its decision."""
    decision = decide(client, headers, agent_id, tool, **parameters)
    assert decision["outcome"] == "escalated", decision
    return decision


def authorize_raw(client, headers, agent_id: str, parameters_json: str) -> Any:
    """POST /v1/authorize with the parameters exactly as written (key order, ``1500.0``)."""
    body = f'{{"agent_id": "{agent_id}", "tool_name": "{REFUND}", "parameters": {parameters_json}}}'
    response = client.post(
        "/v1/authorize", data=body, content_type="application/json", headers=headers
    )
    assert response.status_code == 200, response.get_data(as_text=True)
    return response.get_json()


def read(client, headers, approval_id: str) -> Any:
    response = client.get(f"/v1/approvals/{approval_id}", headers=headers)
    assert response.status_code == 200, response.get_data(as_text=True)
    return response.get_json()


def approve(client, headers, approval_id: str, **body: Any) -> Any:
    kwargs = {"json": body} if body else {}
    return client.post(f"/v1/approvals/{approval_id}/approve", headers=headers, **kwargs)


def deny(client, headers, approval_id: str, **body: Any) -> Any:
    kwargs = {"json": body} if body else {}
    return client.post(f"/v1/approvals/{approval_id}/deny", headers=headers, **kwargs)


def approved(client, headers, approval_id: str, **body: Any) -> Any:
    response = approve(client, headers, approval_id, **body)
    assert response.status_code == 200, response.get_data(as_text=True)
    return response.get_json()


def listed(client, headers, **query: Any) -> Any:
    response = client.get("/v1/approvals", query_string=query, headers=headers)
    assert response.status_code == 200, response.get_data(as_text=True)
    return response.get_json()


def listed_ids(client, headers, **query: Any) -> list[str]:
    return [approval["id"] for approval in listed(client, headers, **query)["data"]]


def audit(client, headers, **query: Any) -> list[Any]:
    response = client.get("/v1/audit-logs", query_string=query, headers=headers)
    assert response.status_code == 200, response.get_data(as_text=True)
    return list(response.get_json()["data"])


def calls(client, headers, agent_id: str, result: str) -> list[Any]:
    """The agent's audited calls (action ``authorize``, not the decisions on approvals) with
    this result, newest first."""
    return audit(client, headers, agent_id=agent_id, action="authorize", result=result)


# --- fixtures ---------------------------------------------------------------------------------


@pytest.fixture
def refunds(client, admin_headers) -> Refunds:
    return new_agent(client, admin_headers, REFUNDS)


@pytest.fixture
def runner(client, admin_headers) -> Key:
    """The key the agent's calls are made with (an admin key: it could decide, were it not
    the caller)."""
    return new_key(client, admin_headers, "runner", "admin")


@pytest.fixture
def alice(client, admin_headers) -> Key:
    """A human's key: scope ``approver``."""
    return new_key(client, admin_headers, "alice", "approver")


# --- the escalated decision -------------------------------------------------------------------


def test_an_escalated_call_is_200_not_allowed_and_names_the_approval(client, runner, refunds):
    response = client.post(
        "/v1/authorize",
        json={"agent_id": refunds.agent_id, "tool_name": REFUND, "parameters": {"amount": 1500}},
        headers=runner.headers,
    )
    assert response.status_code == 200
    decision = response.get_json()
    assert decision["allowed"] is False
    assert decision["outcome"] == "escalated"
    assert (decision["policyId"], decision["ruleIndex"]) == (refunds.policy_id, APPROVAL_RULE)
    assert "must be at most 1000" in decision["reason"]
    assert "retryAfterSeconds" not in decision
    approval = read(client, runner.headers, decision["approvalId"])
    assert approval["status"] == "pending"
    assert decision["approvalExpiresAt"] == approval["expiresAt"]
    assert instant(approval["expiresAt"]) - instant(approval["createdAt"]) == DEFAULT_TTL


def test_the_approval_lives_as_long_as_the_rule_s_ttl_seconds(client, admin_headers):
    rules = [
        {"type": "tool_allowlist"},
        {"type": "require_approval", "tools": ["shell.*"], "approval": {"ttlSeconds": 600}},
    ]
    agent = new_agent(client, admin_headers, rules)
    decision = escalate(client, admin_headers, agent.agent_id, "shell.exec", cmd="ls")
    approval = read(client, admin_headers, decision["approvalId"])
    assert decision["approvalExpiresAt"] == approval["expiresAt"]
    expires, created = instant(approval["expiresAt"]), instant(approval["createdAt"])
    assert expires - created == timedelta(seconds=600)


def test_an_escalated_call_is_audited_as_escalated_with_its_approval(client, runner, refunds):
    decision = escalate(client, runner.headers, refunds.agent_id, amount=1500)
    [entry] = audit(client, runner.headers, agent_id=refunds.agent_id)
    assert entry["id"] == decision["auditId"]
    assert entry["action"] == "authorize"
    assert entry["result"] == "escalated"
    assert entry["approvalId"] == decision["approvalId"]
    assert (entry["policyId"], entry["ruleIndex"]) == (refunds.policy_id, APPROVAL_RULE)
    assert entry["reason"] == decision["reason"]
    by_result = calls(client, runner.headers, refunds.agent_id, "escalated")
    assert [e["id"] for e in by_result] == [entry["id"]]


def test_decisions_without_an_approval_carry_a_null_approval_id(client, runner, refunds):
    granted = decide(client, runner.headers, refunds.agent_id, REFUND, amount=10)
    refused = decide(client, runner.headers, refunds.agent_id, "shell.exec")
    assert (granted["outcome"], granted["ruleIndex"]) == ("allowed", 0)
    assert refused["outcome"] == "denied"
    for decision in (granted, refused):
        assert "approvalId" in decision
        assert decision["approvalId"] is None
        assert "approvalExpiresAt" not in decision
    entries = audit(client, runner.headers, agent_id=refunds.agent_id)
    assert len(entries) == 2
    assert [entry["approvalId"] for entry in entries] == [None, None]
    assert listed(client, runner.headers)["data"] == []


# --- which calls share an approval ------------------------------------------------------------


def test_identical_calls_reuse_the_pending_approval_whatever_key_order_or_number_form(
    client, runner, refunds
):
    first = authorize_raw(
        client, runner.headers, refunds.agent_id, '{"amount": 1500, "currency": "EUR"}'
    )
    second = authorize_raw(
        client, runner.headers, refunds.agent_id, '{"currency": "EUR", "amount": 1500.0}'
    )
    assert first["outcome"] == second["outcome"] == "escalated"
    assert second["approvalId"] == first["approvalId"]
    assert second["approvalExpiresAt"] == first["approvalExpiresAt"]  # not extended
    assert listed_ids(client, runner.headers) == [first["approvalId"]]


def test_a_parameter_changed_by_one_character_gets_another_approval(client, runner, refunds):
    first = escalate(client, runner.headers, refunds.agent_id, amount=1500, memo="order 1234")
    second = escalate(client, runner.headers, refunds.agent_id, amount=1500, memo="order 1235")
    assert second["approvalId"] != first["approvalId"]
    assert len(listed_ids(client, runner.headers, status="pending")) == 2


def test_the_same_parameters_for_another_agent_or_tool_get_another_approval(client, admin_headers):
    rules = [{"type": "tool_allowlist"}, {"type": "require_approval", "tools": ["payments.*"]}]
    one = new_agent(client, admin_headers, rules, "one")
    two = new_agent(client, admin_headers, rules, "two")
    ids = {
        escalate(client, admin_headers, one.agent_id, REFUND, amount=5)["approvalId"],
        escalate(client, admin_headers, two.agent_id, REFUND, amount=5)["approvalId"],
        escalate(client, admin_headers, one.agent_id, "payments.charge", amount=5)["approvalId"],
    }
    assert len(ids) == 3


def test_the_digest_is_of_the_parameters_before_redaction(client, runner, refunds):
    """Two calls that differ only in a secret are two calls, though both show ``[REDACTED]``."""
    first = escalate(client, runner.headers, refunds.agent_id, amount=1500, password="hunter2")
    second = escalate(client, runner.headers, refunds.agent_id, amount=1500, password="hunter3")
    assert second["approvalId"] != first["approvalId"]
    one = read(client, runner.headers, first["approvalId"])
    two = read(client, runner.headers, second["approvalId"])
    assert one["parameters"] == two["parameters"] == {"amount": 1500, "password": MASK}
    assert one["parametersDigest"] != two["parametersDigest"]


def test_the_approval_object_has_every_field_with_parameters_redacted_as_in_the_audit_log(
    client, runner, refunds
):
    parameters = {"amount": 1500, "password": "hunter2", "note": {"api_key": "abc", "n": 1}}
    first = escalate(client, runner.headers, refunds.agent_id, **parameters)
    again = authorize_raw(
        client,
        runner.headers,
        refunds.agent_id,
        '{"note": {"n": 1.0, "api_key": "abc"}, "password": "hunter2", "amount": 1500.0}',
    )
    assert again["approvalId"] == first["approvalId"]

    approval = read(client, runner.headers, first["approvalId"])
    assert set(approval) == APPROVAL_FIELDS
    assert approval["id"] == first["approvalId"]
    assert str(uuid.UUID(approval["id"])) == approval["id"]
    assert approval["agentId"] == refunds.agent_id
    assert approval["toolName"] == REFUND
    assert approval["parameters"] == {
        "amount": 1500,
        "password": MASK,
        "note": {"api_key": MASK, "n": 1},
    }
    entries = audit(client, runner.headers, agent_id=refunds.agent_id)
    assert [entry["parameters"] for entry in entries] == [approval["parameters"]] * 2
    assert DIGEST.fullmatch(approval["parametersDigest"])
    canonical = rfc8785.dumps(parameters)  # the parameters as received, not as shown
    assert approval["parametersDigest"] == hashlib.sha256(canonical).hexdigest()
    assert (approval["policyId"], approval["ruleIndex"]) == (refunds.policy_id, APPROVAL_RULE)
    assert approval["status"] == "pending"
    assert instant(approval["createdAt"]) == instant(entries[-1]["timestamp"])  # the first call
    assert approval["expiresAt"] == first["approvalExpiresAt"]
    assert approval["decidedAt"] is None
    assert approval["decidedBy"] is None
    assert approval["comment"] is None
    assert approval["usedAt"] is None
    assert approval["requestedByKeyId"] == runner.id
    # the list shows the same object
    assert listed(client, runner.headers)["data"] == [approval]


# --- approving --------------------------------------------------------------------------------


def test_an_approver_key_approves_and_is_named_on_the_approval(
    client, runner, alice, refunds, clock
):
    pending = escalate(client, runner.headers, refunds.agent_id, amount=1500)
    before = clock.moment
    response = approve(client, alice.headers, pending["approvalId"], comment="refund ok'd by ops")
    after = clock.moment
    assert response.status_code == 200
    approval = response.get_json()
    assert set(approval) == APPROVAL_FIELDS
    assert approval["id"] == pending["approvalId"]
    assert approval["status"] == "approved"
    assert approval["decidedBy"] == {"keyId": alice.id, "name": "alice"}
    assert before < instant(approval["decidedAt"]) <= after
    assert approval["comment"] == "refund ok'd by ops"
    assert approval["usedAt"] is None
    assert read(client, runner.headers, pending["approvalId"]) == approval


def test_another_admin_key_may_approve_too(client, runner, admin_headers, refunds):
    pending = escalate(client, runner.headers, refunds.agent_id, amount=1500)
    assert approved(client, admin_headers, pending["approvalId"])["status"] == "approved"


def test_an_approved_call_is_allowed_once_then_escalates_anew(
    client, runner, alice, refunds, clock
):
    pending = escalate(client, runner.headers, refunds.agent_id, amount=1500)
    approved(client, alice.headers, pending["approvalId"])

    before = clock.moment
    allowed = decide(client, runner.headers, refunds.agent_id, REFUND, amount=1500)
    after = clock.moment
    assert allowed["allowed"] is True
    assert allowed["outcome"] == "allowed"
    assert (allowed["policyId"], allowed["ruleIndex"]) == (refunds.policy_id, APPROVAL_RULE)
    assert allowed["approvalId"] == pending["approvalId"]
    assert "approvalExpiresAt" not in allowed
    used = read(client, runner.headers, pending["approvalId"])
    assert used["status"] == "used"
    assert before < instant(used["usedAt"]) <= after
    [entry] = calls(client, runner.headers, refunds.agent_id, "allowed")
    assert (entry["id"], entry["approvalId"]) == (allowed["auditId"], pending["approvalId"])

    anew = escalate(client, runner.headers, refunds.agent_id, amount=1500)
    assert anew["approvalId"] != pending["approvalId"]
    assert read(client, runner.headers, anew["approvalId"])["status"] == "pending"
    assert read(client, runner.headers, pending["approvalId"])["status"] == "used"


def test_approving_is_audited_once_with_the_comment_as_reason(client, runner, alice, refunds):
    pending = escalate(client, runner.headers, refunds.agent_id, amount=1500, password="pw")
    approved(client, alice.headers, pending["approvalId"], comment="customer called")
    [entry] = audit(client, alice.headers, action="approval.approve")
    assert entry["action"] == "approval.approve"
    assert entry["result"] == "allowed"
    assert entry["approvalId"] == pending["approvalId"]
    assert entry["reason"] == "customer called"
    assert entry["agentId"] == refunds.agent_id
    assert entry["toolName"] == REFUND
    assert entry["parameters"] == {"amount": 1500, "password": MASK}
    # the escalated call and the approval: nothing else was written
    assert len(audit(client, alice.headers, agent_id=refunds.agent_id)) == 2


def test_approving_without_a_comment_is_audited_as_approved_by_the_key_name(
    client, runner, alice, refunds
):
    pending = escalate(client, runner.headers, refunds.agent_id, amount=1500)
    approved(client, alice.headers, pending["approvalId"])
    [entry] = audit(client, alice.headers, action="approval.approve")
    assert entry["reason"] == "approved by alice"


def test_an_approval_is_not_used_when_the_call_no_longer_needs_one(
    client, admin_headers, runner, alice, refunds
):
    pending = escalate(client, runner.headers, refunds.agent_id, amount=1500)
    approved(client, alice.headers, pending["approvalId"])
    patch = {"rules": REFUNDS[:1]}  # the require_approval rule is gone
    response = client.patch(f"/v1/policies/{refunds.policy_id}", json=patch, headers=admin_headers)
    assert response.status_code == 200, response.get_data(as_text=True)
    decision = decide(client, runner.headers, refunds.agent_id, REFUND, amount=1500)
    assert (decision["outcome"], decision["ruleIndex"], decision["approvalId"]) == (
        "allowed",
        0,
        None,
    )
    assert read(client, runner.headers, pending["approvalId"])["status"] == "approved"


# --- denying ----------------------------------------------------------------------------------


def test_a_denied_approval_denies_identical_calls_until_it_expires_then_they_escalate_anew(
    client, runner, alice, refunds, clock
):
    pending = escalate(client, runner.headers, refunds.agent_id, amount=1500)
    response = deny(client, alice.headers, pending["approvalId"], comment="not this one")
    assert response.status_code == 200
    denied = response.get_json()
    assert denied["status"] == "denied"
    assert denied["decidedBy"] == {"keyId": alice.id, "name": "alice"}
    assert denied["comment"] == "not this one"

    for _ in range(2):
        decision = decide(client, runner.headers, refunds.agent_id, REFUND, amount=1500)
        assert (decision["allowed"], decision["outcome"]) == (False, "denied")
        assert decision["approvalId"] == pending["approvalId"]
        assert (decision["policyId"], decision["ruleIndex"]) == (refunds.policy_id, APPROVAL_RULE)
        assert f"approval {pending['approvalId']} was denied" in decision["reason"]
        assert "approvalExpiresAt" not in decision
    entries = calls(client, runner.headers, refunds.agent_id, "denied")
    assert [entry["approvalId"] for entry in entries] == [pending["approvalId"]] * 2
    # another call is untouched by the denial
    other = escalate(client, runner.headers, refunds.agent_id, amount=1501)
    assert other["approvalId"] != pending["approvalId"]

    clock.advance(DEFAULT_TTL.total_seconds() - 1)  # a second before it expires: still denied
    late = decide(client, runner.headers, refunds.agent_id, REFUND, amount=1500)
    assert (late["outcome"], late["approvalId"]) == ("denied", pending["approvalId"])
    clock.advance(1)
    anew = escalate(client, runner.headers, refunds.agent_id, amount=1500)
    assert anew["approvalId"] not in (pending["approvalId"], other["approvalId"])
    assert read(client, runner.headers, pending["approvalId"])["status"] == "denied"


def test_denying_is_audited_with_the_comment_or_denied_by_the_key_name(
    client, runner, alice, refunds
):
    first = escalate(client, runner.headers, refunds.agent_id, amount=1500)
    second = escalate(client, runner.headers, refunds.agent_id, amount=2500)
    assert deny(client, alice.headers, first["approvalId"], comment="fraud").status_code == 200
    assert deny(client, alice.headers, second["approvalId"]).status_code == 200
    entries = audit(client, alice.headers, action="approval.deny")
    assert [(e["approvalId"], e["result"], e["reason"]) for e in entries] == [
        (second["approvalId"], "denied", "denied by alice"),
        (first["approvalId"], "denied", "fraud"),
    ]
    assert audit(client, alice.headers, action="approval.approve") == []


# --- who may decide ---------------------------------------------------------------------------


@pytest.mark.parametrize("verb", ["approve", "deny"])
def test_the_key_that_made_the_call_may_not_decide_it(client, runner, refunds, verb):
    pending = escalate(client, runner.headers, refunds.agent_id, amount=1500)
    response = client.post(f"/v1/approvals/{pending['approvalId']}/{verb}", headers=runner.headers)
    assert_error(response, 403, "SELF_APPROVAL_FORBIDDEN")
    assert read(client, runner.headers, pending["approvalId"])["status"] == "pending"
    assert audit(client, runner.headers, action=f"approval.{verb}") == []


def test_a_key_whose_identical_call_reused_the_approval_may_not_decide_it(
    client, admin_headers, runner, alice, refunds
):
    bob = new_key(client, admin_headers, "bob", "approver")
    pending = escalate(client, runner.headers, refunds.agent_id, amount=1500)
    reused = escalate(client, bob.headers, refunds.agent_id, amount=1500)
    assert reused["approvalId"] == pending["approvalId"]
    assert_error(
        approve(client, bob.headers, pending["approvalId"]), 403, "SELF_APPROVAL_FORBIDDEN"
    )
    assert_error(deny(client, bob.headers, pending["approvalId"]), 403, "SELF_APPROVAL_FORBIDDEN")
    approval = read(client, bob.headers, pending["approvalId"])
    assert approval["status"] == "pending"
    assert approval["requestedByKeyId"] == runner.id  # the first caller, still
    assert approved(client, alice.headers, pending["approvalId"])["decidedBy"]["keyId"] == alice.id


@pytest.mark.parametrize("verb", ["approve", "deny"])
def test_a_read_only_key_may_not_decide(client, runner, readonly_headers, refunds, verb):
    pending = escalate(client, runner.headers, refunds.agent_id, amount=1500)
    response = client.post(
        f"/v1/approvals/{pending['approvalId']}/{verb}", headers=readonly_headers
    )
    assert_error(response, 403, "INSUFFICIENT_SCOPE")
    assert read(client, readonly_headers, pending["approvalId"])["status"] == "pending"


def test_an_approver_key_may_not_create_agents_or_policies(client, alice, refunds):
    agent = client.post("/v1/agents", json={"name": "sneaky"}, headers=alice.headers)
    assert_error(agent, 403, "INSUFFICIENT_SCOPE")
    body = {"agent_id": refunds.agent_id, "name": "open", "rules": [{"type": "tool_allowlist"}]}
    policy = client.post("/v1/policies", json=body, headers=alice.headers)
    assert_error(policy, 403, "INSUFFICIENT_SCOPE")


def test_an_approver_key_changes_nothing_else(client, admin_headers, alice, refunds):
    """Nor may it change or delete them, or mint keys (a key of its own could call the agent
    and another approve for it)."""
    policy = f"/v1/policies/{refunds.policy_id}"
    agent = f"/v1/agents/{refunds.agent_id}"
    for response in (
        client.patch(policy, json={"enabled": False}, headers=alice.headers),
        client.delete(policy, headers=alice.headers),
        client.patch(agent, json={"status": "suspended"}, headers=alice.headers),
        client.delete(agent, headers=alice.headers),
        client.post(
            "/v1/api-keys", json={"name": "x", "scopes": ["approver"]}, headers=alice.headers
        ),
    ):
        assert_error(response, 403, "INSUFFICIENT_SCOPE")
    assert client.get(policy, headers=admin_headers).json["enabled"] is True
    assert client.get(agent, headers=admin_headers).json["status"] == "active"


def test_an_approver_key_reads_agents_audit_logs_and_approvals(client, runner, alice, refunds):
    pending = escalate(client, runner.headers, refunds.agent_id, amount=1500)
    for path in (
        "/v1/agents",
        f"/v1/agents/{refunds.agent_id}",
        f"/v1/policies/{refunds.policy_id}",
        "/v1/audit-logs",
        "/v1/approvals",
        f"/v1/approvals/{pending['approvalId']}",
    ):
        response = client.get(path, headers=alice.headers)
        assert response.status_code == 200, (path, response.get_data(as_text=True))


def test_api_keys_are_created_with_the_approver_scope(client, admin_headers, runner, refunds):
    body = {"name": "carol", "scopes": ["approver"]}
    response = client.post("/v1/api-keys", json=body, headers=admin_headers)
    assert response.status_code == 201, response.get_data(as_text=True)
    created = response.get_json()
    assert created["scopes"] == ["approver"]
    pending = escalate(client, runner.headers, refunds.agent_id, amount=1500)
    decided = approved(client, bearer(created["key"]), pending["approvalId"])
    assert decided["decidedBy"] == {"keyId": created["id"], "name": "carol"}


# --- 409, 404, 400 ----------------------------------------------------------------------------


@pytest.mark.parametrize(("first", "then"), [("approve", "approve"), ("approve", "deny"),
                                             ("deny", "approve"), ("deny", "deny")])  # fmt: skip
def test_deciding_twice_is_409_approval_not_pending(client, runner, alice, refunds, first, then):
    pending = escalate(client, runner.headers, refunds.agent_id, amount=1500)
    url = f"/v1/approvals/{pending['approvalId']}"
    assert client.post(f"{url}/{first}", headers=alice.headers).status_code == 200
    decided = read(client, runner.headers, pending["approvalId"])
    assert_error(client.post(f"{url}/{then}", headers=alice.headers), 409, "APPROVAL_NOT_PENDING")
    assert read(client, runner.headers, pending["approvalId"]) == decided
    assert len(audit(client, runner.headers, agent_id=refunds.agent_id)) == 2  # call + first


def test_deciding_a_used_approval_is_409(client, runner, alice, refunds):
    pending = escalate(client, runner.headers, refunds.agent_id, amount=1500)
    approved(client, alice.headers, pending["approvalId"])
    assert decide(client, runner.headers, refunds.agent_id, REFUND, amount=1500)["allowed"]
    for decided in (approve, deny):
        response = decided(client, alice.headers, pending["approvalId"])
        assert_error(response, 409, "APPROVAL_NOT_PENDING")
    assert read(client, runner.headers, pending["approvalId"])["status"] == "used"


def test_deciding_an_expired_approval_is_409(client, runner, alice, refunds, clock):
    pending = escalate(client, runner.headers, refunds.agent_id, amount=1500)
    clock.advance(DEFAULT_TTL.total_seconds())
    for decided in (approve, deny):
        response = decided(client, alice.headers, pending["approvalId"])
        assert_error(response, 409, "APPROVAL_NOT_PENDING")
    assert read(client, runner.headers, pending["approvalId"])["status"] == "expired"
    assert audit(client, runner.headers, action="approval.approve") == []
    assert audit(client, runner.headers, action="approval.deny") == []


def test_an_unknown_approval_is_404(client, alice):
    unknown = str(uuid.uuid4())
    assert_error(
        client.get(f"/v1/approvals/{unknown}", headers=alice.headers), 404, "APPROVAL_NOT_FOUND"
    )
    assert_error(approve(client, alice.headers, unknown), 404, "APPROVAL_NOT_FOUND")
    assert_error(deny(client, alice.headers, unknown), 404, "APPROVAL_NOT_FOUND")


def test_another_workspace_s_approval_is_404_and_not_listed(
    client, runner, refunds, other_workspace
):
    pending = escalate(client, runner.headers, refunds.agent_id, amount=1500)
    stranger = other_workspace.headers("admin")
    url = f"/v1/approvals/{pending['approvalId']}"
    assert_error(client.get(url, headers=stranger), 404, "APPROVAL_NOT_FOUND")
    assert_error(client.post(f"{url}/approve", headers=stranger), 404, "APPROVAL_NOT_FOUND")
    assert_error(client.post(f"{url}/deny", headers=stranger), 404, "APPROVAL_NOT_FOUND")
    assert listed(client, stranger)["data"] == []
    assert listed(client, stranger, agent_id=refunds.agent_id)["data"] == []
    assert read(client, runner.headers, pending["approvalId"])["status"] == "pending"


@pytest.mark.parametrize(("method", "suffix"), [("get", ""), ("post", "/approve"),
                                                ("post", "/deny")])  # fmt: skip
def test_a_malformed_approval_id_is_400(client, alice, method, suffix):
    response = getattr(client, method)(f"/v1/approvals/not-a-uuid{suffix}", headers=alice.headers)
    assert_error(response, 400, "VALIDATION_ERROR")


def test_a_comment_over_2000_characters_is_400_and_changes_nothing(client, runner, alice, refunds):
    pending = escalate(client, runner.headers, refunds.agent_id, amount=1500)
    for decided in (approve, deny):
        response = decided(client, alice.headers, pending["approvalId"], comment="x" * 2001)
        assert_error(response, 400, "VALIDATION_ERROR")
    assert read(client, runner.headers, pending["approvalId"])["status"] == "pending"
    assert len(audit(client, runner.headers, agent_id=refunds.agent_id)) == 1  # the call only
    assert (
        approved(client, alice.headers, pending["approvalId"], comment="y" * 2000)["comment"]
        == "y" * 2000
    )


def test_an_unknown_body_member_is_400_and_changes_nothing(client, runner, alice, refunds):
    pending = escalate(client, runner.headers, refunds.agent_id, amount=1500)
    for decided in (approve, deny):
        response = decided(client, alice.headers, pending["approvalId"], reason="looks fine")
        assert_error(response, 400, "VALIDATION_ERROR")
    approval = read(client, runner.headers, pending["approvalId"])
    assert (approval["status"], approval["decidedBy"], approval["comment"]) == (
        "pending",
        None,
        None,
    )
    assert len(audit(client, runner.headers, agent_id=refunds.agent_id)) == 1


def test_deciding_without_a_body_is_fine(client, runner, alice, refunds):
    pending = escalate(client, runner.headers, refunds.agent_id, amount=1500)
    response = client.post(f"/v1/approvals/{pending['approvalId']}/approve", headers=alice.headers)
    assert response.status_code == 200, response.get_data(as_text=True)
    assert (response.json["status"], response.json["comment"]) == ("approved", None)


# --- expiry -----------------------------------------------------------------------------------


def test_a_pending_approval_past_its_expiry_reads_expired_everywhere(
    client, runner, refunds, clock
):
    pending = escalate(client, runner.headers, refunds.agent_id, amount=1500)
    clock.advance(DEFAULT_TTL.total_seconds() - 1)
    assert read(client, runner.headers, pending["approvalId"])["status"] == "pending"
    clock.advance(1)
    assert read(client, runner.headers, pending["approvalId"])["status"] == "expired"
    assert listed_ids(client, runner.headers, status="expired") == [pending["approvalId"]]
    assert listed_ids(client, runner.headers, status="pending") == []
    [shown] = listed(client, runner.headers)["data"]
    assert shown["status"] == "expired"
    # the identical call waits for a new one
    anew = escalate(client, runner.headers, refunds.agent_id, amount=1500)
    assert anew["approvalId"] != pending["approvalId"]
    assert listed_ids(client, runner.headers, status="pending") == [anew["approvalId"]]
    assert listed_ids(client, runner.headers, status="expired") == [pending["approvalId"]]


def test_an_approved_approval_not_used_before_expiry_reads_expired_and_the_call_escalates_anew(
    client, runner, alice, refunds, clock
):
    pending = escalate(client, runner.headers, refunds.agent_id, amount=1500)
    approved(client, alice.headers, pending["approvalId"])
    clock.advance(DEFAULT_TTL.total_seconds())
    approval = read(client, runner.headers, pending["approvalId"])
    assert approval["status"] == "expired"
    assert approval["decidedBy"] == {"keyId": alice.id, "name": "alice"}  # its history stays
    assert listed_ids(client, runner.headers, status="approved") == []
    assert listed_ids(client, runner.headers, status="expired") == [pending["approvalId"]]

    anew = escalate(client, runner.headers, refunds.agent_id, amount=1500)
    assert anew["approvalId"] != pending["approvalId"]
    assert calls(client, runner.headers, refunds.agent_id, "allowed") == []
    assert read(client, runner.headers, pending["approvalId"])["usedAt"] is None


# --- the list ---------------------------------------------------------------------------------


@pytest.fixture
def mixed(client, admin_headers, runner, alice, clock) -> dict[str, str]:
    """One approval reading as each status, labelled by it; the expired one is the oldest."""
    rules = [
        {"type": "tool_allowlist"},
        {"type": "require_approval", "tools": ["payments.*"]},
        {"type": "require_approval", "tools": ["ops.*"], "approval": {"ttlSeconds": 60}},
    ]
    agent = new_agent(client, admin_headers, rules).agent_id
    made = {"expired": escalate(client, runner.headers, agent, "ops.restart")["approvalId"]}
    clock.advance(120)
    for n, status in enumerate(("pending", "approved", "denied", "used")):
        made[status] = escalate(client, runner.headers, agent, REFUND, n=n)["approvalId"]
    approved(client, alice.headers, made["approved"])
    assert deny(client, alice.headers, made["denied"]).status_code == 200
    approved(client, alice.headers, made["used"])
    assert decide(client, runner.headers, agent, REFUND, n=3)["approvalId"] == made["used"]
    return made


@pytest.mark.parametrize("status", STATUSES)
def test_the_status_filter_matches_what_each_approval_reads_as(client, runner, mixed, status):
    found = listed(client, runner.headers, status=status)["data"]
    assert [approval["id"] for approval in found] == [mixed[status]]
    assert found[0]["status"] == status


def test_an_unknown_status_is_400(client, runner):
    response = client.get("/v1/approvals", query_string={"status": "open"}, headers=runner.headers)
    assert_error(response, 400, "VALIDATION_ERROR")


def test_the_agent_id_filter(client, admin_headers, runner, refunds):
    other = new_agent(client, admin_headers, REFUNDS, "other")
    mine = escalate(client, runner.headers, refunds.agent_id, amount=1500)["approvalId"]
    theirs = escalate(client, runner.headers, other.agent_id, amount=1500)["approvalId"]
    assert listed_ids(client, runner.headers, agent_id=refunds.agent_id) == [mine]
    assert listed_ids(client, runner.headers, agent_id=other.agent_id) == [theirs]
    assert listed_ids(client, runner.headers, agent_id=str(uuid.uuid4())) == []
    response = client.get(
        "/v1/approvals", query_string={"agent_id": "nope"}, headers=runner.headers
    )
    assert_error(response, 400, "VALIDATION_ERROR")


def test_the_tool_name_filter(client, admin_headers, runner):
    rules = [{"type": "tool_allowlist"}, {"type": "require_approval", "tools": ["payments.*"]}]
    agent = new_agent(client, admin_headers, rules).agent_id
    refund = escalate(client, runner.headers, agent, REFUND, amount=5)["approvalId"]
    charge = escalate(client, runner.headers, agent, "payments.charge", amount=5)["approvalId"]
    assert listed_ids(client, runner.headers, tool_name=REFUND) == [refund]
    assert listed_ids(client, runner.headers, tool_name="payments.charge") == [charge]
    assert listed_ids(client, runner.headers, tool_name="payments.*") == []


def test_approvals_are_listed_newest_first_in_the_pagination_envelope(client, runner, refunds):
    made = [
        escalate(client, runner.headers, refunds.agent_id, amount=1001 + n)["approvalId"]
        for n in range(5)
    ]
    newest_first = made[::-1]
    assert listed_ids(client, runner.headers) == newest_first
    page = listed(client, runner.headers, limit=2, offset=1)
    assert set(page) == {"data", "pagination"}
    assert page["pagination"] == {"limit": 2, "offset": 1, "count": 2, "total": 5}
    assert [approval["id"] for approval in page["data"]] == newest_first[1:3]
    last = listed(client, runner.headers, limit=2, offset=4)
    assert last["pagination"] == {"limit": 2, "offset": 4, "count": 1, "total": 5}
    assert listed(client, runner.headers)["pagination"]["limit"] == 100


@pytest.mark.parametrize(("limit", "status"), [("0", 400), ("1", 200), ("200", 200),
                                               ("201", 400), ("-1", 400)])  # fmt: skip
def test_limit_is_between_1_and_200(client, runner, limit, status):
    response = client.get("/v1/approvals", query_string={"limit": limit}, headers=runner.headers)
    if status == 400:
        assert_error(response, 400, "VALIDATION_ERROR")
    else:
        assert response.status_code == 200
        assert response.json["pagination"]["limit"] == int(limit)


# --- rate limits ------------------------------------------------------------------------------


def limited(max_calls: int, window_seconds: int, ttl_seconds: int = 3600) -> list[Any]:
    """REFUNDS, with a rate limit in the same policy (rule 2)."""
    rate = {"maxCalls": max_calls, "windowSeconds": window_seconds}
    escalating = {**REFUNDS[1], "approval": {"ttlSeconds": ttl_seconds}}
    return [REFUNDS[0], escalating, {"type": "rate_limit", "rateLimit": rate}]


def test_escalations_do_not_take_from_the_rate_limit_the_approved_call_does(
    client, admin_headers, runner, alice
):
    agent = new_agent(client, admin_headers, limited(max_calls=1, window_seconds=3600)).agent_id
    pending = [escalate(client, runner.headers, agent, amount=1500) for _ in range(3)]
    approved(client, alice.headers, pending[0]["approvalId"])
    allowed = decide(client, runner.headers, agent, REFUND, amount=1500)
    assert (allowed["outcome"], allowed["approvalId"]) == ("allowed", pending[0]["approvalId"])
    # that call took the one slot: a call needing no approval is now refused by the limit
    refused = decide(client, runner.headers, agent, REFUND, amount=10)
    assert (refused["outcome"], refused["ruleIndex"]) == ("denied", 2)
    assert "retryAfterSeconds" in refused


def test_an_approved_call_refused_by_an_exhausted_rate_limit_leaves_the_approval_approved(
    client, admin_headers, runner, alice, clock
):
    rules = limited(max_calls=1, window_seconds=60, ttl_seconds=600)
    agent = new_agent(client, admin_headers, rules).agent_id
    pending = escalate(client, runner.headers, agent, amount=1500)
    approved(client, alice.headers, pending["approvalId"])
    assert decide(client, runner.headers, agent, REFUND, amount=10)["allowed"]  # the one slot

    refused = decide(client, runner.headers, agent, REFUND, amount=1500)
    assert (refused["allowed"], refused["outcome"], refused["ruleIndex"]) == (False, "denied", 2)
    assert refused["approvalId"] is None
    assert "retryAfterSeconds" in refused
    [entry] = calls(client, runner.headers, agent, "denied")
    assert entry["approvalId"] is None
    approval = read(client, runner.headers, pending["approvalId"])
    assert (approval["status"], approval["usedAt"]) == ("approved", None)

    clock.advance(60)  # the next window: the approval still grants its one call
    allowed = decide(client, runner.headers, agent, REFUND, amount=1500)
    assert (allowed["outcome"], allowed["approvalId"]) == ("allowed", pending["approvalId"])
    assert read(client, runner.headers, pending["approvalId"])["status"] == "used"


# --- deleting the agent -----------------------------------------------------------------------


def test_deleting_the_agent_deletes_its_approvals(client, admin_headers, runner, alice, refunds):
    pending = escalate(client, runner.headers, refunds.agent_id, amount=1500)
    decided = escalate(client, runner.headers, refunds.agent_id, amount=2500)
    approved(client, alice.headers, decided["approvalId"])
    keep = new_agent(client, admin_headers, REFUNDS, "keeper")
    kept = escalate(client, runner.headers, keep.agent_id, amount=1500)

    response = client.delete(f"/v1/agents/{refunds.agent_id}", headers=admin_headers)
    assert response.status_code == 204
    for gone in (pending, decided):
        url = f"/v1/approvals/{gone['approvalId']}"
        assert_error(client.get(url, headers=admin_headers), 404, "APPROVAL_NOT_FOUND")
    assert listed_ids(client, admin_headers) == [kept["approvalId"]]
    assert listed_ids(client, admin_headers, agent_id=refunds.agent_id) == []


# --- API keys never travel back ---------------------------------------------------------------


def test_a_call_whose_tool_name_holds_a_key_is_denied_not_bound_to_an_approval(
    client, admin_headers, runner
):
    """Approvals show tool names with keys masked, so two names differing only in the key
    would read alike: such a call is denied rather than escalated, and no approval is made."""
    agent = new_agent(client, admin_headers, [{"type": "require_approval"}]).agent_id
    planted = "svc_" + "5e" * 16
    body = {"agent_id": agent, "tool_name": f"calendar.{planted}", "parameters": {}}
    response = client.post("/v1/authorize", json=body, headers=runner.headers)
    assert response.status_code == 200
    assert planted not in response.get_data(as_text=True)
    decision = response.json
    assert (decision["outcome"], decision["approvalId"]) == ("denied", None)
    assert "cannot be bound to an approval" in decision["reason"]
    assert listed_ids(client, admin_headers) == []
    [entry] = audit(client, runner.headers, agent_id=agent)
    assert entry["toolName"] == f"calendar.{MASK}"


def test_a_key_in_the_comment_is_masked_on_the_approval_as_in_the_audit_log(
    client, runner, alice, refunds
):
    pending = escalate(client, runner.headers, refunds.agent_id, amount=1500)
    planted = "svc_" + "7a" * 16
    decided = approve(client, alice.headers, pending["approvalId"], comment=f"use {planted}")
    assert decided.status_code == 200
    [entry] = audit(client, alice.headers, action="approval.approve")
    assert entry["reason"] == f"use {MASK}"
    assert planted not in decided.get_data(as_text=True)
    assert read(client, runner.headers, pending["approvalId"])["comment"] == f"use {MASK}"


# --- single use across processes --------------------------------------------------------------

CALLERS = 20
RUN_SECONDS = 240  # the whole run, start-up included: a bound, never a measurement
STOP_SECONDS = 10
ROOT = Path(__file__).resolve().parents[2]
KEY_VARIABLE = "AGENTAUTH_TEST_CALLER_KEY"  # the key travels in the environment, not argv
CALLER = "from tests.api.test_approvals import call_when_told; call_when_told()"


def call_when_told() -> None:
    """A caller process's main: its own app (its own connections and group-commit recorder) on
    the shared database. Prints ``{"ready": status}`` once connected, waits for the start signal
    (end of file on stdin, which every caller gets at once), makes one call and prints
    ``{"status", "body"}``; ``{"error"}`` instead if anything fails."""
    from api import create_app

    database_url, moment, agent_id, parameters = sys.argv[1:5]
    settings = Settings(database_url=database_url, rate_limit_per_minute=100_000)
    app = create_app(settings, clock=FakeClock(moment=datetime.fromisoformat(moment)))
    headers = bearer(os.environ[KEY_VARIABLE])

    def say(message: dict[str, Any]) -> None:
        print(json.dumps(message), flush=True)

    try:
        client = app.test_client()
        say({"ready": client.get(f"/v1/agents/{agent_id}", headers=headers).status_code})
        sys.stdin.buffer.read()  # the start signal
        body = {"agent_id": agent_id, "tool_name": REFUND, "parameters": json.loads(parameters)}
        response = client.post("/v1/authorize", json=body, headers=headers)
        say({"status": response.status_code, "body": response.get_json()})
    except Exception as exc:
        say({"error": repr(exc)})
    finally:
        app.extensions["agentauth"].close()


def _forward_lines(stream: Any, index: int, into: queue.Queue[tuple[int, Any]]) -> None:
    for line in stream:
        into.put((index, line))
    into.put((index, None))  # end of file: the process has ended


def _one_line_each(
    lines: queue.Queue[tuple[int, Any]], count: int, deadline: float, logs: Path
) -> dict[int, Any]:
    """The next message of every caller, by index; fails at the deadline or when one ends
    without it."""
    got: dict[int, Any] = {}
    while len(got) < count:
        try:
            index, line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            pytest.fail(f"{len(got)} of {count} callers answered in time")
        if line is None:
            if index in got:  # it said what it had to, then ended
                continue
            pytest.fail(f"caller {index} ended early:\n{(logs / f'{index}.log').read_text()}")
        message = json.loads(line)
        assert "error" not in message, (index, message)
        got[index] = message
    return got


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    """Each caller ends by itself once it has answered; any still running after
    :data:`STOP_SECONDS` is killed (SIGKILL to its PID)."""
    grace = time.monotonic() + STOP_SECONDS
    for process in processes:
        try:
            process.wait(timeout=max(0.0, grace - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=STOP_SECONDS)


@pytest.mark.slow
def test_an_approval_allows_exactly_one_of_many_identical_calls_from_separate_processes(
    client, settings, workspace, runner, alice, refunds, clock, tmp_path
):
    parameters = {"amount": 5000, "currency": "EUR"}
    pending = escalate(client, runner.headers, refunds.agent_id, **parameters)
    approved(client, alice.headers, pending["approvalId"])
    keys = [workspace.key("approver") for _ in range(CALLERS)]  # a key each: no shared slot
    argv = [
        sys.executable, "-c", CALLER, settings.database_url, clock.moment.isoformat(),
        refunds.agent_id, json.dumps(parameters),
    ]  # fmt: skip

    deadline = time.monotonic() + RUN_SECONDS
    lines: queue.Queue[tuple[int, Any]] = queue.Queue()
    processes: list[subprocess.Popen[bytes]] = []
    readers = []
    start_read, start_write = os.pipe()  # every caller's stdin: closing it starts them all
    try:
        for index, key in enumerate(keys):
            with (tmp_path / f"{index}.log").open("wb") as log:
                process = subprocess.Popen(
                    argv,
                    stdin=start_read,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    cwd=ROOT,
                    env={**os.environ, KEY_VARIABLE: key},
                )
            processes.append(process)
            reader = threading.Thread(target=_forward_lines, args=(process.stdout, index, lines))
            reader.start()
            readers.append(reader)
        ready = _one_line_each(lines, CALLERS, deadline, tmp_path)
        assert {message["ready"] for message in ready.values()} == {200}
        os.close(start_write)
        start_write = -1
        told = _one_line_each(lines, CALLERS, deadline, tmp_path)
    finally:
        os.close(start_read)
        if start_write != -1:
            os.close(start_write)
        _stop(processes)
        for reader in readers:
            reader.join(timeout=STOP_SECONDS)
        for process in processes:
            process.stdout.close()
    clock.advance(1)  # past every reading the callers took

    assert {message["status"] for message in told.values()} == {200}
    allowed = [(i, m["body"]) for i, m in told.items() if m["body"]["allowed"]]
    others = [(i, m["body"]) for i, m in told.items() if not m["body"]["allowed"]]
    assert len(allowed) == 1, [body for _, body in allowed]
    assert allowed[0][1]["approvalId"] == pending["approvalId"]
    assert allowed[0][1]["ruleIndex"] == APPROVAL_RULE
    assert {body["outcome"] for _, body in others} == {"escalated"}
    [anew] = {body["approvalId"] for _, body in others}
    assert anew != pending["approvalId"]

    assert read(client, alice.headers, pending["approvalId"])["status"] == "used"
    assert read(client, alice.headers, anew)["status"] == "pending"
    assert listed_ids(client, alice.headers, agent_id=refunds.agent_id, status="pending") == [anew]
    grants = calls(client, alice.headers, refunds.agent_id, "allowed")
    assert [entry["approvalId"] for entry in grants] == [pending["approvalId"]]
    escalations = calls(client, alice.headers, refunds.agent_id, "escalated")
    assert len(escalations) == 1 + len(others)
    # every caller that escalated asked for the new approval: none of their keys may decide it
    for index, _ in others:
        assert_error(approve(client, bearer(keys[index]), anew), 403, "SELF_APPROVAL_FORBIDDEN")
