"""require_approval from a policy repository: a reviewer sees the rule in every plan format,
apply puts it in force, and the service then escalates the call it names (decisions §5, §6)."""

from __future__ import annotations

import json
from pathlib import Path

import git
import pytest

from api import create_app
from controller.repo import load_repo
from controller.sources import read_files
from core.config import Settings
from tests.conftest import FakeClock, Tenant
from tests.controller.conftest import agent_doc, write_files

REFUNDS = """
    apiVersion: agentauth/v1
    kind: Policy
    metadata: {name: refunds}
    spec:
      agent: finance-agent
      rules:
        - {type: tool_allowlist, tools: [payments.refund]}
"""
GATED = (
    REFUNDS
    + """\
        - type: require_approval
          tools: [payments.refund]
          parameters: {amount: {max: 500}}
          approval: {ttlSeconds: 900}
"""
)


@pytest.fixture
def applied(cli, repo_dir, ws_name):
    write_files(repo_dir, {"agents.yaml": agent_doc("finance-agent"), "refunds.yaml": REFUNDS})
    assert cli("apply", repo_dir, "--workspace", ws_name).exit_code == 0
    write_files(repo_dir, {"refunds.yaml": GATED})
    return repo_dir


@pytest.mark.parametrize("fmt", ["text", "markdown", "json"])
def test_every_plan_format_shows_the_rule_a_reviewer_approves(cli, applied, ws_name, fmt):
    result = cli("plan", applied, "--workspace", ws_name, "--format", fmt, "--detailed-exitcode")
    assert result.exit_code == 2, result.output  # changes to apply
    if fmt == "json":
        [change] = json.loads(result.stdout)["changes"]
        [field] = change["fields"]
        assert field["path"] == "rules[1]"
        assert field["after"] == {
            "type": "require_approval",
            "tools": ["payments.refund"],
            "parameters": {"amount": {"max": 500}},
            "approval": {"ttlSeconds": 900},
        }
        return
    assert "rules[1]" in result.stdout
    assert "require_approval" in result.stdout
    assert '"ttlSeconds": 900' in result.stdout
    assert '"parameters": {"amount": {"max": 500}}' in result.stdout


@pytest.mark.parametrize("fmt", ["text", "markdown", "json"])
def test_a_diff_between_revisions_shows_the_rule_in_every_format(cli, tmp_path, fmt):
    work = git.Repo.init(tmp_path / "repo")
    folder = Path(str(work.working_tree_dir))
    write_files(folder, {"agents.yaml": agent_doc("finance-agent"), "refunds.yaml": REFUNDS})
    work.git.add(A=True)
    base = work.index.commit("base").hexsha
    write_files(folder, {"refunds.yaml": GATED})
    work.git.add(A=True)
    work.index.commit("refunds above 500 need a person")
    result = cli("diff", base, "HEAD", "--repo", folder, "--format", fmt, db=False)
    assert result.exit_code == 0, result.output
    if fmt == "json":
        [change] = json.loads(result.stdout)["changes"]
        [field] = change["fields"]
        assert field["after"]["type"] == "require_approval"
        assert field["after"]["approval"] == {"ttlSeconds": 900}
        return
    assert "rules[1]" in result.stdout
    assert '"type": "require_approval"' in result.stdout
    assert '"ttlSeconds": 900' in result.stdout


def test_applied_the_rule_escalates_the_call_it_names(cli, applied, ws_name, database_url):
    assert cli("apply", applied, "--workspace", ws_name).exit_code == 0
    app = create_app(Settings(database_url=database_url, rate_limit_per_minute=100_000))
    tenant, client = Tenant(app, ws_name, FakeClock()), app.test_client()
    agent = load_repo(read_files(applied), ws_name).agents["finance-agent"].id
    headers = tenant.headers("admin")
    try:
        for amount, outcome in ((400, "allowed"), (4000, "escalated")):
            body = {
                "agent_id": agent,
                "tool_name": "payments.refund",
                "parameters": {"amount": amount},
            }
            decision = client.post("/v1/authorize", json=body, headers=headers).json
            assert decision["outcome"] == outcome, decision
        assert decision["ruleIndex"] == 1
        assert "parameter 'amount' must be at most 500" in decision["reason"]
    finally:
        app.extensions["agentauth"].close()
