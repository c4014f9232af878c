"""A key of this service is never stored where it would be shown again (#22, finding 9, "no
response body ever contains a key"): a string of a request body that holds one is refused with a
400 naming the field, without the key, and nothing is created. The exceptions are a tool call
(decided and audited whatever it holds) and an approval's comment: a key in either is masked
where it is stored (tests/api/test_authorize.py, tests/api/test_approvals.py)."""

from __future__ import annotations

import pytest

from tests.api.helpers import make_agent

FAKE = "svc_" + "0123456789abcdef" * 2


def _bodies(agent: str, key: str) -> dict[str, tuple[str, str, dict]]:
    rule = {"type": "tool_allowlist", "tools": ["search"]}
    return {
        "agent name": ("/v1/agents", "name", {"name": f"bot-{key}"}),
        "agent description": ("/v1/agents", "description", {"name": "a", "description": key}),
        "policy name": ("/v1/policies", "name",
                        {"agent_id": agent, "name": f"p-{key}", "rules": [rule]}),
        "tool pattern": ("/v1/policies", "rules[0].tools[0]",
                         {"agent_id": agent, "name": "p",
                          "rules": [{"type": "tool_allowlist", "tools": [key]}]}),
        "key name": ("/v1/api-keys", "name", {"name": key, "scopes": ["read-only"]}),
        "webhook url": ("/v1/webhooks", "url",
                        {"url": f"https://example.com/{key}", "events": ["approval.requested"]}),
    }  # fmt: skip


@pytest.mark.parametrize(
    "case",
    ["agent name", "agent description", "policy name", "tool pattern", "key name", "webhook url"],
)  # fmt: skip
@pytest.mark.parametrize("issued", [True, False], ids=["issued key", "made-up key"])
def test_a_key_in_a_stored_string_is_refused(client, workspace, case, issued):
    admin = workspace.headers("admin")
    agent = make_agent(client, admin)
    key = workspace.key("read-only") if issued else FAKE
    path, field, body = _bodies(agent, key)[case]
    before = {
        p: client.get(p, headers=admin).get_data()
        for p in ("/v1/agents", "/v1/policies", "/v1/api-keys", "/v1/webhooks", "/v1/audit-logs")
    }
    answer = client.post(path, json=body, headers=admin)
    assert answer.status_code == 400
    error = answer.json["error"]
    assert error["code"] == "VALIDATION_ERROR"
    assert [d["field"] for d in error["details"]] == [field]
    assert key not in answer.get_data(as_text=True)
    assert key[4:] not in answer.get_data(as_text=True)
    after = {p: client.get(p, headers=admin).get_data() for p in before}
    assert after == before  # nothing created, nothing audited


def test_a_key_among_a_tool_call_s_parameters_is_decided_and_redacted(client, workspace):
    admin = workspace.headers("admin")
    agent = make_agent(client, admin, rules=[{"type": "tool_allowlist", "tools": ["search"]}])
    call = {"agent_id": agent, "tool_name": "search", "parameters": {"q": f"use {FAKE}"}}
    answer = client.post("/v1/authorize", json=call, headers=admin)
    assert answer.status_code == 200
    assert answer.json["allowed"] is True
    entry = client.get("/v1/audit-logs", headers=admin).json["data"][0]
    assert entry["parameters"] == {"q": "use [REDACTED]"}
