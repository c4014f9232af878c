"""Modes from a policy repository (decisions §10): ``mode`` in the YAML (one schema with the
API), a bad one refused at validation with its file and line; a mode change is a reviewed change
like any other: plan and diff show it, and plan (and diff with ``--db``) put beside it what the
policy would have done on live traffic so far, its shadow report; the lint knows that a warn or
shadow policy decides no real call."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import git
import pytest

from api import create_app
from controller.repo import load_repo
from controller.sources import read_files
from core.config import Settings
from tests.conftest import FakeClock, Tenant
from tests.controller.conftest import agent_doc, write_files


def refunds(mode: str | None, priority: int = 10) -> str:
    extra = f"\n      mode: {mode}" if mode else ""
    return f"""
    apiVersion: agentauth/v1
    kind: Policy
    metadata: {{name: no-big-refunds}}
    spec:
      agent: finance-agent
      priority: {priority}{extra}
      rules:
        - {{type: tool_denylist, tools: [payments.refund]}}
"""


ALLOW_ALL = """
    apiVersion: agentauth/v1
    kind: Policy
    metadata: {name: everything}
    spec:
      agent: finance-agent
      rules:
        - {type: tool_allowlist, tools: ["*"]}
"""


def files(mode: str | None) -> dict[str, str | None]:
    return {
        "agents.yaml": agent_doc("finance-agent"),
        "everything.yaml": ALLOW_ALL,
        "refunds.yaml": refunds(mode),
    }


def decide_calls(database_url: str, ws_name: str, folder: Path, tools: list[str]) -> None:
    """Calls of the repository's agent through the service (at the real time: the evidence is
    of the last 7 days)."""
    app = create_app(Settings(database_url=database_url, rate_limit_per_minute=100_000))
    try:
        tenant = Tenant(app, ws_name, FakeClock())
        client, headers = app.test_client(), tenant.headers("admin")
        agent = load_repo(read_files(folder), ws_name).agents["finance-agent"].id
        for tool in tools:
            body = {"agent_id": agent, "tool_name": tool, "parameters": {}}
            response = client.post("/v1/authorize", json=body, headers=headers)
            assert response.status_code == 200, response.get_data(as_text=True)
            assert response.json["allowed"] is True  # shadow: the real decision allows
    finally:
        app.extensions["agentauth"].close()


def test_a_mode_in_the_repository_is_applied(cli, repo_dir, ws_name, database_url):
    write_files(repo_dir, files("shadow"))
    assert cli("apply", repo_dir, "--workspace", ws_name).exit_code == 0
    app = create_app(Settings(database_url=database_url))
    try:
        tenant = Tenant(app, ws_name, FakeClock())
        listed = app.test_client().get("/v1/policies", headers=tenant.headers("admin")).json
    finally:
        app.extensions["agentauth"].close()
    modes = {policy["name"]: policy["mode"] for policy in listed["data"]}
    assert modes == {"everything": "enforce", "no-big-refunds": "shadow"}


def test_a_bad_mode_is_refused_with_its_file_and_line(cli, repo_dir, ws_name):
    write_files(repo_dir, files("audit"))
    result = cli("validate", repo_dir, db=False)
    assert result.exit_code == 1, result.output
    assert re.search(r"refunds\.yaml:7:\d+: spec\.mode: ", result.output), result.output


@pytest.fixture
def tried(cli, repo_dir, ws_name, database_url) -> Path:
    """The refunds policy applied in shadow, four calls made (two it would deny), then the
    repository moving it to enforce (not applied yet)."""
    write_files(repo_dir, files("shadow"))
    assert cli("apply", repo_dir, "--workspace", ws_name).exit_code == 0
    tools = ["payments.refund", "search.web", "payments.refund", "search.web"]
    decide_calls(database_url, ws_name, repo_dir, tools)
    write_files(repo_dir, {"refunds.yaml": refunds("enforce")})
    return repo_dir


def _report(document: dict[str, Any]) -> dict[str, Any]:
    [evidence] = document["evidence"]
    assert (evidence["policy"], evidence["mode_before"], evidence["mode_after"]) == (
        "no-big-refunds", "shadow", "enforce",
    )  # fmt: skip
    return dict(evidence["report"])


@pytest.mark.parametrize("fmt", ["text", "markdown", "json"])
def test_plan_shows_a_mode_change_beside_what_the_policy_would_have_done(cli, tried, ws_name, fmt):
    result = cli("plan", tried, "--workspace", ws_name, "--format", fmt, "--detailed-exitcode")
    assert result.exit_code == 2, result.output
    if fmt == "json":
        document = json.loads(result.stdout)
        [change] = document["changes"]
        assert [(f["path"], f["before"], f["after"]) for f in change["fields"]] == [
            ("mode", "shadow", "enforce")
        ]
        report = _report(document)
        assert (report["calls"], report["changed"], report["wouldDeny"]) == (4, 2, 2)
        assert report["byTool"] == [
            {"toolName": "payments.refund", "calls": 2, "changed": 2},
            {"toolName": "search.web", "calls": 2, "changed": 0},
        ]
        return
    out = result.stdout
    assert "mode" in out
    assert "shadow" in out
    assert "enforce" in out
    if fmt == "text":
        assert (
            "no-big-refunds (agent finance-agent): shadow -> enforce: 4 calls with a would-be "
            "decision, 2 changed (2 would deny, 0 would escalate, 0 would allow), 0 errors"
        ) in out
        assert "payments.refund: 2 calls, 2 changed" in out
    else:
        assert "| no-big-refunds | shadow → enforce | 4 | 2 | 2 | 0 | 0 | 0 |" in out


def _committed(tmp_path: Path, ws_files: list[dict[str, str | None]]) -> tuple[Path, list[str]]:
    work = git.Repo.init(tmp_path / "repo")
    folder = Path(str(work.working_tree_dir))
    commits = []
    for n, revision in enumerate(ws_files):
        write_files(folder, revision)
        work.git.add(A=True)
        commits.append(work.index.commit(f"revision {n}").hexsha)
    return folder, commits


def test_diff_shows_the_mode_change_and_reads_its_evidence_only_with_a_database(
    cli, tmp_path, ws_name, database_url
):
    folder, (base, head) = _committed(
        tmp_path, [files("shadow"), {"refunds.yaml": refunds("warn")}]
    )
    plain = cli("diff", base, head, "--repo", folder, "--workspace", ws_name, db=False)
    assert plain.exit_code == 0, plain.output
    assert "no-big-refunds (agent finance-agent): shadow -> warn" in plain.stdout
    assert "give --db to read it" in plain.stdout
    # the base applied and tried on live traffic: diff --db reads its report
    work = git.Repo(folder)
    work.git.checkout(base)
    assert cli("apply", folder, "--workspace", ws_name).exit_code == 0
    decide_calls(database_url, ws_name, folder, ["payments.refund"])
    work.git.checkout(head)
    found = cli(
        "diff", base, head, "--repo", folder, "--workspace", ws_name, "--format", "json",
        "--db", database_url, db=False,
    )  # fmt: skip
    assert found.exit_code == 0, found.output
    report = json.loads(found.stdout)["evidence"][0]["report"]
    assert (report["calls"], report["changed"], report["wouldDeny"]) == (1, 1, 1)


def test_a_warn_or_shadow_policy_makes_no_enforced_rule_unreachable(cli, repo_dir):
    deny_everything = """
    apiVersion: agentauth/v1
    kind: Policy
    metadata: {name: deny-all-tried}
    spec:
      agent: finance-agent
      priority: 50
      mode: shadow
      rules:
        - {type: tool_denylist, tools: ["*"]}
"""
    write_files(repo_dir, {**files("shadow"), "deny.yaml": deny_everything})
    result = cli("validate", repo_dir, db=False)
    assert result.exit_code == 0, result.output
    # the enforced allow-all is still reached; the shadow refunds rule is not, in the would-be
    # decision, where the shadow deny-all decides first
    assert "everything.yaml" not in result.output
    assert "refunds.yaml" in result.output
    assert "never reached" in result.output
