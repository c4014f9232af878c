"""A policy whose agent gets another id (``metadata.id`` pinned on an applied agent, an agent
renamed): plan shows each policy moving, apply moves exactly those, in place, and the old agent
is kept or pruned with nothing left to cascade. Through the CLI and the API, as a user sees it."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import Result
from sqlalchemy import select

from api import create_app
from controller.repo import load_repo
from controller.sources import read_files
from core.config import Settings
from core.store.database import Database
from core.store.models import Policy
from tests.conftest import FakeClock, Tenant
from tests.controller.conftest import agent_doc, write_files

REFUNDS = """
apiVersion: agentauth/v1
kind: Policy
metadata: {name: refunds}
spec:
  agent: finance-agent
  rules:
    - type: tool_allowlist
      tools: ["payments.refund"]
    - type: rate_limit
      tools: ["payments.refund"]
      rateLimit: {maxCalls: 2, windowSeconds: 3600}
"""
NO_SHELL = """
apiVersion: agentauth/v1
kind: Policy
metadata: {name: no-shell}
spec:
  agent: finance-agent
  priority: 100
  rules: [{type: tool_denylist, tools: ["shell.*"]}]
"""
FILES = {
    "agents/finance.yaml": agent_doc("finance-agent", "description: pays refunds"),
    "policies/refunds.yaml": REFUNDS,
    "policies/no-shell.yaml": NO_SHELL,
}


def _pinned() -> dict[str, str | None]:
    """The agent's file with an id of its own (ids are unique across workspaces)."""
    document = agent_doc("finance-agent", "description: pays refunds")
    pinned = f"name: finance-agent\n      id: {uuid.uuid4()}"
    return {"agents/finance.yaml": document.replace("name: finance-agent", pinned)}


def _renamed() -> dict[str, str | None]:
    return {
        "agents/finance.yaml": agent_doc("payments-agent", "description: pays refunds"),
        "policies/refunds.yaml": REFUNDS.replace("finance-agent", "payments-agent"),
        "policies/no-shell.yaml": NO_SHELL.replace("finance-agent", "payments-agent"),
    }


#: how the agent gets another id: the files that change, and the agent's name afterwards
EDITS: dict[str, tuple[Callable[[], dict[str, str | None]], str]] = {
    "id-pinned": (_pinned, "finance-agent"),
    "renamed": (_renamed, "payments-agent"),
}

API = tuple[object, dict[str, str]]


@pytest.fixture
def api(database_url: str, ws_name: str) -> Iterator[API]:
    """The API of the workspace the repository is applied to, on a clock the test holds (a
    rate-limit window cannot end mid-test)."""
    clock = FakeClock()
    settings = Settings(database_url=database_url, rate_limit_per_minute=100_000)
    app = create_app(settings, clock=clock)
    yield app.test_client(), Tenant(app, ws_name, clock).headers("admin")
    app.extensions["agentauth"].close()


def _refund(api: API, agent_id: str) -> tuple[bool, str | None]:
    client, headers = api
    call = {"agent_id": agent_id, "tool_name": "payments.refund", "parameters": {"amount": 5}}
    body = client.post("/v1/authorize", json=call, headers=headers).json  # type: ignore[attr-defined]
    return body["allowed"], body["policyId"]


def _listed(api: API, noun: str) -> list[dict[str, object]]:
    client, headers = api
    return client.get(f"/v1/{noun}?limit=100", headers=headers).json["data"]  # type: ignore[attr-defined]


@pytest.mark.parametrize("flags", [(), ("--prune-agents",)], ids=["kept", "pruned"])
@pytest.mark.parametrize("edit", sorted(EDITS))
def test_a_policy_whose_agent_gets_another_id_moves_as_planned(
    cli: Callable[..., Result],
    repo_dir: Path,
    ws_name: str,
    api: API,
    edit: str,
    flags: tuple[str, ...],
) -> None:
    write_files(repo_dir, FILES)
    assert cli("apply", repo_dir, "--workspace", ws_name).exit_code == 0
    before = load_repo(read_files(repo_dir), ws_name)
    old_id = before.agents["finance-agent"].id
    policy_ids = {name: p.id for name, p in before.policies.items()}
    assert [_refund(api, old_id)[0] for _ in range(2)] == [True, True]  # the limit is used up
    files, name = EDITS[edit]
    write_files(repo_dir, files())
    new_id = load_repo(read_files(repo_dir), ws_name).agents[name].id

    def plan(*extra: str) -> Result:
        return cli("plan", repo_dir, "--workspace", ws_name, "--replay", "0", *flags, *extra)

    shown = plan()
    assert shown.exit_code == 0, shown.output
    retired = "1 to delete." if flags else "0 to delete, 1 kept."
    assert shown.stdout.startswith(f"Plan: 1 to create, 2 to update, {retired}\n")
    assert shown.stdout.count(f'agent_id: "{old_id}" -> "{new_id}"') == 2
    assert ("- Agent finance-agent" if flags else "= Agent finance-agent") in shown.stdout
    assert plan("--format", "markdown").stdout.count(f'+ agent_id: "{new_id}"') == 2
    changes = json.loads(plan("--format", "json").stdout)["changes"]
    moved = {"path": "agent_id", "drift": False, "before": old_id, "after": new_id}
    assert {c["name"]: c["fields"][-1] for c in changes if c["action"] == "update"} == {
        "refunds": moved,
        "no-shell": moved,
    }

    applied = cli("apply", repo_dir, "--workspace", ws_name, *flags)
    assert applied.exit_code == 0, applied.output
    assert applied.stdout.startswith(shown.stdout)  # apply made exactly the plan it showed
    policies = {p["name"]: (p["id"], p["agentId"]) for p in _listed(api, "policies")}
    assert policies == {name: (pid, new_id) for name, pid in policy_ids.items()}
    agents = sorted(a["id"] for a in _listed(api, "agents"))
    assert agents == sorted([new_id] if flags else [new_id, old_id])
    assert _refund(api, new_id) == (False, policy_ids["refunds"])  # the counter moved along
    if not flags:
        assert _refund(api, old_id) == (False, None)  # kept, with no policy: default deny
    again = plan().stdout
    assert again.startswith("Plan: no changes." if flags else "Plan: 0 to create, 0 to update")


def test_a_database_applied_before_agent_ids_were_recorded_shows_no_drift(
    cli: Callable[..., Result], repo_dir: Path, ws_name: str, database_url: str
) -> None:
    """Rows whose managed_spec has no policy ``agent_id`` (written by an earlier controller):
    nothing to change, and a move later is not drift."""
    write_files(repo_dir, FILES)
    assert cli("apply", repo_dir, "--workspace", ws_name).exit_code == 0
    db = Database(Settings(database_url=database_url))
    with db.transaction(write=True) as session:
        workspace_id = load_repo([], ws_name).workspace_id
        for policy in session.scalars(select(Policy).where(Policy.workspace_id == workspace_id)):
            policy.managed_spec = {k: v for k, v in policy.managed_spec.items() if k != "agent_id"}
    db.dispose()
    assert cli("plan", repo_dir, "--workspace", ws_name).stdout == "Plan: no changes.\n"
    write_files(repo_dir, _pinned())
    moved = cli("plan", repo_dir, "--workspace", ws_name, "--format", "json")
    summary = json.loads(moved.stdout)["summary"]
    assert (summary["update"], summary["drift"]) == (2, 0)
