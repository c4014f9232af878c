"""Small helpers the API tests share: asserting the error body, reading timestamps, making an
agent with a policy, asking for a decision, writing audit entries as decisions do."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from core.store import audit


def assert_error(response: Any, status: int, code: str) -> Any:
    """The response is the spec's error body with this status and code; returns ``error``."""
    assert response.status_code == status, response.get_data(as_text=True)[:500]
    assert response.mimetype == "application/json"
    body = response.get_json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) <= {"code", "message", "details"}
    assert error["code"] == code
    assert isinstance(error["message"], str)
    assert error["message"]
    assert "Traceback" not in error["message"]
    return error


def instant(text: str) -> datetime:
    """An ISO 8601 timestamp as the API writes it (UTC, ``Z``); fails on anything else."""
    assert text.endswith("Z"), text
    moment = datetime.fromisoformat(text)
    assert moment.utcoffset() == timedelta(0)
    return moment


def make_agent(client: Any, headers: Any, name: str = "agent", rules: list | None = None) -> str:
    """A new agent (with one policy of ``rules`` when given); its id."""
    agent = client.post("/v1/agents", json={"name": name}, headers=headers)
    assert agent.status_code == 201, agent.get_data(as_text=True)
    if rules is not None:
        body = {"agent_id": agent.json["id"], "name": f"{name}-policy", "rules": rules}
        policy = client.post("/v1/policies", json=body, headers=headers)
        assert policy.status_code == 201, policy.get_data(as_text=True)
    return str(agent.json["id"])


def decide(client: Any, headers: Any, agent_id: str, tool: str, **parameters: Any) -> Any:
    """POST /v1/authorize; the decision body (asserting the 200)."""
    body = {"agent_id": agent_id, "tool_name": tool, "parameters": parameters}
    response = client.post("/v1/authorize", json=body, headers=headers)
    assert response.status_code == 200, response.get_data(as_text=True)
    return dict(response.json)


def aged_entries(workspace_id: str, old: int, total: int, now: datetime) -> list[dict[str, Any]]:
    """``total`` entries of unknown agents, the first ``old`` of them 40 days before ``now``,
    the rest of ``now`` (seconds apart, in order): what a retention of 30 days prunes."""
    return [
        {
            "workspace_id": workspace_id, "agent_id": str(uuid.uuid4()), "agent_exists": False,
            "key_id": None, "tool_name": "calendar.read", "parameters": {"n": n},
            "result": "allowed", "policy_id": None, "rule_index": None, "reason": "r",
            "latency_ms": 1.0,
            "timestamp": now - timedelta(days=40 if n < old else 0, seconds=10 - n),
        }
        for n in range(total)
    ]  # fmt: skip


def record_audit_entries(app: Any, entries: Iterable[dict[str, Any]]) -> None:
    """Audit entries written the way decisions write them: each row made by
    ``core.store.audit.entry`` from ``entries``' fields, all of them through the app's
    group-commit recorder in one transaction."""
    rows = [audit.entry(**fields) for fields in entries]

    def write(batch: Any) -> None:
        for row in rows:
            batch.append_audit(row)

    app.extensions["agentauth"].recorder.run(write)
