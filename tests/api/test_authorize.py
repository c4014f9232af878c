"""POST /v1/authorize over HTTP: the decision fields, validation, agent status, unknown agents,
rate-limit rules, cache freshness across app instances, and failing closed."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from api import create_app

ALLOW_CALENDAR = [{"type": "tool_allowlist", "tools": ["calendar.*"]}]


@pytest.fixture
def agent(client, admin_headers):
    return client.post("/v1/agents", json={"name": "assistant"}, headers=admin_headers).json


def make_policy(client, headers, agent_id, rules, **extra):
    body = {"agent_id": agent_id, "name": extra.pop("name", "p"), "rules": rules, **extra}
    response = client.post("/v1/policies", json=body, headers=headers)
    assert response.status_code == 201, response.json
    return response.json


def ask(client, headers, agent_id, tool, **parameters):
    body = {"agent_id": agent_id, "tool_name": tool, "parameters": parameters}
    response = client.post("/v1/authorize", json=body, headers=headers)
    assert response.status_code == 200, response.json
    return response.json


def audit_entries(client, headers, **filters):
    response = client.get("/v1/audit-logs", query_string=filters, headers=headers)
    assert response.status_code == 200, response.json
    return response.json["data"]


def test_allowed_decision_has_every_field_and_its_audit_entry(client, admin_headers, agent):
    policy = make_policy(client, admin_headers, agent["id"], ALLOW_CALENDAR)
    decision = ask(client, admin_headers, agent["id"], "calendar.create", title="standup")
    assert decision["allowed"] is True
    assert decision["outcome"] == "allowed"
    assert decision["policyId"] == policy["id"]
    assert decision["ruleIndex"] == 0
    assert "retryAfterSeconds" not in decision
    assert decision["latencyMs"] >= 0
    [entry] = audit_entries(client, admin_headers, agent_id=agent["id"])
    assert entry["id"] == decision["auditId"]
    assert entry["latencyMs"] == decision["latencyMs"]
    assert (entry["result"], entry["policyId"], entry["toolName"]) == (
        "allowed",
        policy["id"],
        "calendar.create",
    )
    assert entry["parameters"] == {"title": "standup"}


def test_default_deny_is_200_with_null_policy(client, admin_headers, agent):
    make_policy(client, admin_headers, agent["id"], ALLOW_CALENDAR)
    decision = ask(client, admin_headers, agent["id"], "shell.exec")
    assert (decision["allowed"], decision["outcome"]) == (False, "denied")
    assert decision["policyId"] is None
    assert decision["ruleIndex"] is None
    assert "default deny" in decision["reason"]
    [entry] = audit_entries(client, admin_headers, agent_id=agent["id"])
    assert (entry["result"], entry["policyId"]) == ("denied", None)


def test_a_key_in_the_tool_name_is_masked_in_the_answer_as_in_the_log(client, admin_headers, agent):
    """The reason names the tool; a key pasted into the tool name must not travel back in it
    (the guard shows the reason to the agent, and to whatever model runs it)."""
    planted = "svc_" + "5e" * 16
    decision = ask(client, admin_headers, agent["id"], f"calendar.{planted}")
    assert planted not in json.dumps(decision)
    assert "calendar.[REDACTED]" in decision["reason"]
    [entry] = audit_entries(client, admin_headers, agent_id=agent["id"])
    assert entry["reason"] == decision["reason"]


def test_read_only_keys_may_ask(client, workspace, agent, admin_headers):
    make_policy(client, admin_headers, agent["id"], ALLOW_CALENDAR)
    assert ask(client, workspace.headers("read-only"), agent["id"], "calendar.list")["allowed"]


@pytest.mark.parametrize("status", ["suspended", "revoked"])
def test_inactive_agent_is_denied_without_evaluation_and_audited(
    client, admin_headers, agent, status
):
    make_policy(client, admin_headers, agent["id"], ALLOW_CALENDAR)
    patch = client.patch(
        f"/v1/agents/{agent['id']}", json={"status": status}, headers=admin_headers
    )
    assert patch.status_code == 200
    decision = ask(client, admin_headers, agent["id"], "calendar.create")
    assert decision["allowed"] is False
    assert decision["policyId"] is None
    assert status in decision["reason"]
    client.patch(f"/v1/agents/{agent['id']}", json={"status": "active"}, headers=admin_headers)
    assert ask(client, admin_headers, agent["id"], "calendar.create")["allowed"] is True
    assert [e["result"] for e in audit_entries(client, admin_headers)] == ["allowed", "denied"]


def test_unknown_agent_is_denied_and_audited(client, admin_headers):
    ghost = "0f8fad5b-d9cb-469f-a165-70867728950e"
    decision = ask(client, admin_headers, ghost, "calendar.create")
    assert decision["allowed"] is False
    assert "not found" in decision["reason"]
    [entry] = audit_entries(client, admin_headers, agent_id=ghost)
    assert entry["policyId"] is None


def test_another_workspaces_agent_is_unknown(client, admin_headers, agent, other_workspace):
    make_policy(client, admin_headers, agent["id"], ALLOW_CALENDAR)
    outsider = other_workspace.headers("admin")
    decision = ask(client, outsider, agent["id"], "calendar.create")
    assert decision["allowed"] is False
    assert "not found" in decision["reason"]
    assert audit_entries(client, admin_headers) == []


BAD_REQUESTS = {
    "missing-tool": {"agent_id": "0f8fad5b-d9cb-469f-a165-70867728950e"},
    "missing-agent": {"tool_name": "x"},
    "agent-not-uuid": {"agent_id": "agent-1", "tool_name": "x"},
    "parameters-list": {"agent_id": "0f8fad5b-d9cb-469f-a165-70867728950e", "tool_name": "x",
                        "parameters": [1]},
    "tool-empty": {"agent_id": "0f8fad5b-d9cb-469f-a165-70867728950e", "tool_name": ""},
    "tool-256": {"agent_id": "0f8fad5b-d9cb-469f-a165-70867728950e", "tool_name": "t" * 256},
    "tool-10000": {"agent_id": "0f8fad5b-d9cb-469f-a165-70867728950e", "tool_name": "t" * 10_000},
    "tool-nul": {"agent_id": "0f8fad5b-d9cb-469f-a165-70867728950e", "tool_name": "a\u0000b"},
    "tool-newline": {"agent_id": "0f8fad5b-d9cb-469f-a165-70867728950e", "tool_name": "a\nb"},
    "tool-not-string": {"agent_id": "0f8fad5b-d9cb-469f-a165-70867728950e", "tool_name": 7},
    "unknown-field": {"agent_id": "0f8fad5b-d9cb-469f-a165-70867728950e", "tool_name": "x",
                      "user": "me"},
}  # fmt: skip


@pytest.mark.parametrize("body", BAD_REQUESTS.values(), ids=BAD_REQUESTS.keys())
def test_malformed_requests_are_400_and_not_audited(client, admin_headers, body):
    response = client.post("/v1/authorize", json=body, headers=admin_headers)
    assert response.status_code == 400
    assert response.json["error"]["code"] == "VALIDATION_ERROR"
    assert response.json["error"]["details"]
    assert audit_entries(client, admin_headers) == []


def test_parameters_with_100000_keys_are_400_and_not_audited(client, admin_headers, agent):
    parameters = {f"{i:x}": 0 for i in range(100_000)}
    body = json.dumps({"agent_id": agent["id"], "tool_name": "x", "parameters": parameters})
    compact = body.replace(", ", ",").replace(": ", ":")
    assert len(compact) < 1024 * 1024  # under the body limit: refused for what it holds
    response = client.post(
        "/v1/authorize", data=compact, content_type="application/json", headers=admin_headers
    )
    assert response.status_code == 400
    assert response.json["error"]["code"] == "VALIDATION_ERROR"
    assert audit_entries(client, admin_headers) == []


def test_tool_name_of_255_characters_is_accepted(client, admin_headers, agent):
    assert ask(client, admin_headers, agent["id"], "t" * 255)["allowed"] is False


def test_rate_limit_rule_over_http_consumes_only_allowed_calls(client, admin_headers, agent):
    make_policy(client, admin_headers, agent["id"], [
        {"type": "rate_limit", "rateLimit": {"maxCalls": 2, "windowSeconds": 3600}},
        {"type": "parameter_constraint", "tools": ["calendar.create"],
         "parameters": {"title": {"regex": "^[a-z]+$"}}},
        {"type": "tool_allowlist", "tools": ["calendar.*"]},
    ])  # fmt: skip
    assert not ask(client, admin_headers, agent["id"], "calendar.create", title="X!")["allowed"]
    assert ask(client, admin_headers, agent["id"], "calendar.create", title="a")["allowed"]
    assert ask(client, admin_headers, agent["id"], "calendar.list")["allowed"]
    limited = ask(client, admin_headers, agent["id"], "calendar.list")
    assert limited["allowed"] is False
    assert limited["ruleIndex"] == 0
    assert 1 <= limited["retryAfterSeconds"] <= 3600


def test_replacing_rules_resets_rate_counters(client, admin_headers, agent):
    rules = [
        {"type": "rate_limit", "rateLimit": {"maxCalls": 1, "windowSeconds": 3600}},
        {"type": "tool_allowlist"},
    ]
    policy = make_policy(client, admin_headers, agent["id"], rules)
    assert ask(client, admin_headers, agent["id"], "a")["allowed"]
    assert not ask(client, admin_headers, agent["id"], "a")["allowed"]
    changed = [rules[0], {"type": "tool_allowlist", "tools": ["a"]}]  # equal rules keep them
    client.patch(f"/v1/policies/{policy['id']}", json={"rules": changed}, headers=admin_headers)
    assert ask(client, admin_headers, agent["id"], "a")["allowed"]


CHANGES = {
    "disable": lambda c, h, p: c.patch(f"/v1/policies/{p['id']}", json={"enabled": False},
                                       headers=h),
    "delete": lambda c, h, p: c.delete(f"/v1/policies/{p['id']}", headers=h),
    "rules": lambda c, h, p: c.patch(f"/v1/policies/{p['id']}",
                                     json={"rules": [{"type": "tool_denylist"}]}, headers=h),
    "priority": lambda c, h, p: c.post("/v1/policies", headers=h, json={
        "agent_id": p["agentId"], "name": "block", "priority": 9,
        "rules": [{"type": "tool_denylist", "tools": ["calendar.*"]}]}),
}  # fmt: skip


@pytest.mark.parametrize("change", CHANGES.values(), ids=CHANGES.keys())
def test_a_change_made_elsewhere_is_in_force_for_the_next_call(
    app, settings, clock, admin_headers, agent, change
):
    """Two app instances (as two worker processes would be), each with its own policy cache."""
    here = app.test_client()
    elsewhere = create_app(settings, clock=clock)
    try:
        policy = make_policy(here, admin_headers, agent["id"], ALLOW_CALENDAR)
        assert ask(here, admin_headers, agent["id"], "calendar.create")["allowed"]
        assert change(elsewhere.test_client(), admin_headers, policy).status_code in (200, 201, 204)
        assert ask(here, admin_headers, agent["id"], "calendar.create")["allowed"] is False
    finally:
        elsewhere.extensions["agentauth"].close()


def test_fails_closed_when_the_audit_entry_cannot_be_written(
    app, client, admin_headers, agent, workspace
):
    make_policy(client, admin_headers, agent["id"], [
        {"type": "rate_limit", "rateLimit": {"maxCalls": 1, "windowSeconds": 3600}},
        {"type": "tool_allowlist"},
    ])  # fmt: skip
    db = app.extensions["agentauth"].db
    name = "fail_" + workspace.id.replace("-", "")
    with db.transaction(write=True) as session:
        for statement in _failing_insert_trigger(db.is_sqlite, name, workspace.id):
            session.execute(text(statement))
    remaining = int(
        client.get("/v1/agents", headers=admin_headers).headers["X-RateLimit-Remaining"]
    )
    try:
        body = {"agent_id": agent["id"], "tool_name": "calendar.create"}
        response = client.post("/v1/authorize", json=body, headers=admin_headers)
        assert response.status_code == 500
        assert response.json == {
            "error": {"code": "INTERNAL_ERROR", "message": response.json["error"]["message"]}
        }
    finally:
        with db.transaction(write=True) as session:
            session.execute(
                text(f"DROP TRIGGER {name}" + ("" if db.is_sqlite else " ON audit_log"))
            )
    # the service's failure is not charged to the key: only this next request is
    after = client.get("/v1/agents", headers=admin_headers).headers["X-RateLimit-Remaining"]
    assert int(after) == remaining - 1
    # nothing was recorded and the failed call consumed no rate-limit slot
    assert audit_entries(client, admin_headers) == []
    assert ask(client, admin_headers, agent["id"], "calendar.create")["allowed"] is True


def _failing_insert_trigger(sqlite: bool, name: str, workspace_id: str) -> list[str]:
    if sqlite:
        return [
            f"CREATE TRIGGER {name} BEFORE INSERT ON audit_log "
            f"WHEN NEW.workspace_id = '{workspace_id}' "
            "BEGIN SELECT RAISE(ABORT, 'disk full'); END"
        ]
    return [
        f"CREATE OR REPLACE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ "
        "BEGIN RAISE EXCEPTION 'disk full'; END $$",
        f"CREATE TRIGGER {name} BEFORE INSERT ON audit_log FOR EACH ROW "
        f"WHEN (NEW.workspace_id = '{workspace_id}') EXECUTE FUNCTION {name}()",
    ]
