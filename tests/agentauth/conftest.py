"""Fixtures for the client SDK: a real ``agentauth serve`` (one per module, on a free port, on
the run's database), and per test a workspace with an agent whose policies the test decides.
Agents and policies are made through the in-process app on the same database; the SDK talks
to the server over HTTP."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from importlib import metadata
from typing import Any

import httpx
import pytest

from tests.conftest import Tenant
from tests.server import running_server

#: each line of the mcp SDK has its tests: mcp2/ runs in the environment that has mcp 2.x
#: (noxfile.py), test_mcp.py in the main suite's, which pins 1.x; neither is collected in the
#: other (it could not be imported there)
_MCP_MAJOR = int(metadata.version("mcp").split(".")[0])
collect_ignore_glob = ["mcp2/*"] if _MCP_MAJOR < 2 else ["test_mcp.py"]
#: the agent frameworks' tests run where they are installed (nox -s frameworks)
if importlib.util.find_spec("pydantic_ai") is None:
    collect_ignore_glob.append("frameworks/*")

#: the policies most tests use: calendar tools and small refunds allowed, the rest denied
RULES: list[dict[str, Any]] = [
    {"type": "tool_denylist", "tools": ["calendar.delete_*"]},
    {
        "type": "parameter_constraint",
        "tools": ["payments.refund"],
        "parameters": {"amount": {"min": 0, "max": 100}, "currency": {"enum": ["EUR", "USD"]}},
    },
    {"type": "tool_allowlist", "tools": ["calendar.*", "payments.refund", "echo", "add"]},
]


APPROVAL_RULES: list[dict[str, Any]] = [
    {
        "type": "require_approval",
        "tools": ["payments.refund"],
        "parameters": {"amount": {"max": 1000}},
    },
    {"type": "tool_allowlist", "tools": ["payments.refund"]},
]


@pytest.fixture(scope="module")
def service(database_url: str) -> Iterator[str]:
    with running_server(database_url, workers=1, threads=4) as base:
        yield base


@pytest.fixture
def agent_id(client: Any, admin_headers: dict[str, str]) -> str:
    agent = client.post("/v1/agents", json={"name": "support-bot"}, headers=admin_headers)
    assert agent.status_code == 201, agent.get_data(as_text=True)
    body = {"agent_id": agent.json["id"], "name": "support-bot-tools", "rules": RULES}
    policy = client.post("/v1/policies", json=body, headers=admin_headers)
    assert policy.status_code == 201, policy.get_data(as_text=True)
    return str(agent.json["id"])


@pytest.fixture
def api_key(workspace: Tenant) -> str:
    """A read-only key: all an agent needs to ask for decisions."""
    return workspace.key("read-only")


@pytest.fixture
def example_agent(client: Any, admin_headers: dict[str, str]) -> str:
    """An agent for the examples of examples/ (tests/agentauth/examples.py): ``calendar.*``
    allowed, nothing else."""
    from tests.agentauth.examples import RULES as EXAMPLE_RULES

    agent = client.post("/v1/agents", json={"name": "example-bot"}, headers=admin_headers)
    assert agent.status_code == 201, agent.get_data(as_text=True)
    body = {"agent_id": agent.json["id"], "name": "calendar-only", "rules": EXAMPLE_RULES}
    assert client.post("/v1/policies", json=body, headers=admin_headers).status_code == 201
    return str(agent.json["id"])


@pytest.fixture
def approval_agent(client: Any, admin_headers: dict[str, str]) -> str:
    """An agent whose refunds above 1,000 need a human."""
    agent = client.post("/v1/agents", json={"name": "refund-bot"}, headers=admin_headers)
    assert agent.status_code == 201, agent.get_data(as_text=True)
    body = {"agent_id": agent.json["id"], "name": "big-refunds", "rules": APPROVAL_RULES}
    policy = client.post("/v1/policies", json=body, headers=admin_headers)
    assert policy.status_code == 201, policy.get_data(as_text=True)
    return str(agent.json["id"])


@pytest.fixture
def approve(service: str, workspace: Tenant) -> Any:
    """``approve(approval_id)``: a person approves it, with an approver key, over HTTP."""

    def decide(approval_id: str) -> None:
        answer = httpx.post(
            f"{service}/v1/approvals/{approval_id}/approve",
            json={"comment": "approved by the test"},
            headers={"Authorization": f"Bearer {workspace.key('approver')}"},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text

    return decide
