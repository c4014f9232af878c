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


def test_a_key_in_a_policy_file_is_a_located_problem(tmp_path):
    """The same rule through the controller: a repository whose Agent or Policy holds a key is
    refused by validate (exit 1), the problem located, the key never printed."""
    from click.testing import CliRunner

    from controller.cli import main

    (tmp_path / "agent.yaml").write_text(
        "apiVersion: agentauth/v1\nkind: Agent\nmetadata:\n  name: bot\n"
        f"spec:\n  description: calls with {FAKE}\n"
    )
    (tmp_path / "policy.yaml").write_text(
        "apiVersion: agentauth/v1\nkind: Policy\nmetadata:\n  name: p\n"
        "spec:\n  agent: bot\n  rules:\n    - type: tool_allowlist\n"
        f"      tools: [search, {FAKE}]\n"
    )
    cache = {"AGENTAUTH_CACHE_DIR": str(tmp_path / "cache")}
    result = CliRunner().invoke(main, ["validate", str(tmp_path)], env=cache)
    assert result.exit_code == 1
    assert "agent.yaml:6:" in result.output
    assert "spec.description: holds an API key of this service" in result.output
    assert "policy.yaml:9:" in result.output
    assert "spec.rules[0].tools[1]: holds an API key of this service" in result.output
    assert FAKE not in result.output
    assert FAKE[4:] not in result.output


def test_a_key_spelled_with_a_json_escape_is_refused_too(client, workspace):
    admin = workspace.headers("admin")
    escaped = '{"name": "a", "description": "\\u0073vc_' + FAKE[4:] + '"}'
    answer = client.post("/v1/agents", data=escaped, content_type="application/json", headers=admin)
    assert answer.status_code == 400
    assert answer.json["error"]["details"][0]["field"] == "description"
    assert FAKE[4:] not in answer.get_data(as_text=True)


def test_a_key_as_a_member_name_is_refused(client, workspace):
    admin = workspace.headers("admin")
    agent = make_agent(client, admin)
    rules = [{"type": "parameter_constraint", "tools": ["search"],
              "parameters": {FAKE: {"enum": ["a"]}}}]  # fmt: skip
    answer = client.post(
        "/v1/policies", json={"agent_id": agent, "name": "p", "rules": rules}, headers=admin
    )
    assert answer.status_code == 400
    assert answer.json["error"]["details"][0]["field"] == "rules[0].parameters.[REDACTED]"
    assert FAKE[4:] not in answer.get_data(as_text=True)
    assert client.get("/v1/policies", headers=admin).json["data"] == []
