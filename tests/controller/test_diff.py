"""``diff BASE HEAD`` is the plan of HEAD against a database where BASE was applied: with the
same flags, the two commands show the same changes, in every case."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import git
import pytest
from click.testing import Result

from tests.controller.conftest import agent_doc, write_files

REFUNDS = """
apiVersion: agentauth/v1
kind: Policy
metadata: {name: refunds}
spec:
  agent: finance-agent
  priority: 10
  rules: [{type: tool_allowlist, tools: ["payments.refund"]}]
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
TICKETS = """
apiVersion: agentauth/v1
kind: Policy
metadata: {name: tickets}
spec:
  agent: support-bot
  rules: [{type: tool_allowlist, tools: ["tickets.*"]}]
"""
BASE = {
    "agents/finance.yaml": agent_doc("finance-agent", "description: pays refunds"),
    "agents/support.yaml": agent_doc("support-bot"),
    "policies/refunds.yaml": REFUNDS,
    "policies/no-shell.yaml": NO_SHELL,
    "policies/tickets.yaml": TICKETS,
}
PINNED = "5e1f0c1e-2222-4333-8444-555566667777"  # only planned, never written
#: HEAD as the files that change from BASE (None: deleted)
SCENARIOS: dict[str, dict[str, str | None]] = {
    "agent-removed": {"agents/support.yaml": None, "policies/tickets.yaml": None},
    "policy-removed": {"policies/no-shell.yaml": None},
    "policy-edited": {"policies/refunds.yaml": REFUNDS.replace("priority: 10", "priority: 20")},
    "agent-renamed": {
        "agents/support.yaml": agent_doc("help-bot"),
        "policies/tickets.yaml": TICKETS.replace("support-bot", "help-bot"),
    },
    "id-pinned": {
        "agents/support.yaml": agent_doc("support-bot").replace(
            "name: support-bot", f"name: support-bot\n      id: {PINNED}"
        )
    },
    "new-agent": {
        "agents/ops.yaml": agent_doc("ops-bot", "status: active"),
        "policies/ops.yaml": TICKETS.replace("tickets", "ops").replace("support-bot", "ops-bot"),
    },
}


def _changes(result: Result) -> list[tuple[str, str, str, str, str]]:
    """Each change's action, kind, name and id, and an update's fields."""
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    return [
        (c["action"], c["kind"], c["name"], c["id"], json.dumps(c["fields"], sort_keys=True))
        for c in plan["changes"]
    ]


@pytest.mark.parametrize("flags", [(), ("--prune-agents",)], ids=["kept", "pruned"])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_diff_shows_what_plan_shows_after_base_was_applied(
    cli: Callable[..., Result],
    tmp_path: Path,
    ws_name: str,
    scenario: str,
    flags: tuple[str, ...],
) -> None:
    work = git.Repo.init(tmp_path / "repo")
    folder = Path(str(work.working_tree_dir)) / "policies"
    write_files(folder, BASE)
    work.git.add(A=True)
    base = work.index.commit("base").hexsha
    assert cli("apply", folder, "--workspace", ws_name).exit_code == 0
    write_files(folder, SCENARIOS[scenario])
    work.git.add(A=True)
    work.index.commit("head")

    planned = cli("plan", folder, "--workspace", ws_name, "--format", "json", "--replay", "0",
                  *flags)  # fmt: skip
    diffed = cli("diff", base, "HEAD", "--repo", work.working_tree_dir, "--path", "policies",
                 "--workspace", ws_name, "--format", "json", *flags, db=False)  # fmt: skip
    assert _changes(diffed) == _changes(planned)
    assert _changes(planned) != []
