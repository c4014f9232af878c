"""validate, plan, apply and diff as a user runs them: real files, the real database of this
run (SQLite or PostgreSQL), real git repositories made in tmp_path."""

from __future__ import annotations

import json
import re
from pathlib import Path

import git
import pytest

from api import create_app
from controller.apply import apply_repo
from controller.load import SourceFile
from controller.repo import load_repo
from controller.sources import read_files
from core.config import Settings
from core.domain.clock import utc_now
from core.store.database import Database
from core.store.models import Agent, Policy, SyncStatus
from tests.conftest import FakeClock, Tenant
from tests.controller.conftest import agent_doc, write_files

GOLDEN = Path(__file__).parent / "golden"

REFUNDS = """
apiVersion: agentauth/v1
kind: Policy
metadata:
  name: refunds
spec:
  agent: finance-agent
  priority: 10
  rules:
    - type: tool_allowlist
      tools: ["payments.refund"]
    - type: parameter_constraint
      tools: ["payments.*"]
      parameters:
        amount: {min: 0, max: 500}
        currency: {enum: [EUR, USD]}
"""
NO_SHELL = """
apiVersion: agentauth/v1
kind: Policy
metadata:
  name: no-shell
spec:
  agent: finance-agent
  priority: 100
  rules:
    - type: tool_denylist
      tools: ["shell.*"]
"""
BASE = {
    "agents/finance.yaml": agent_doc("finance-agent", "description: pays refunds"),
    "policies/refunds.yaml": REFUNDS,
    "policies/no-shell.yaml": NO_SHELL,
}


def _db(database_url: str) -> Database:
    return Database(Settings(database_url=database_url))


def _rows(database_url: str, workspace_id: str) -> tuple[list[Agent], list[Policy]]:
    db = _db(database_url)
    with db.transaction() as session:
        agents = list(
            session.query(Agent).filter_by(workspace_id=workspace_id).order_by(Agent.name)
        )
        policies = list(
            session.query(Policy).filter_by(workspace_id=workspace_id).order_by(Policy.name)
        )
        session.expunge_all()
    db.dispose()
    return agents, policies


def _status(database_url: str, workspace_id: str) -> SyncStatus | None:
    db = _db(database_url)
    with db.transaction() as session:
        status = session.get(SyncStatus, workspace_id)
        if status is not None:
            session.expunge(status)
    db.dispose()
    return status


def _tenant(database_url: str, name: str) -> tuple[Tenant, object]:
    app = create_app(Settings(database_url=database_url, rate_limit_per_minute=100_000))
    return Tenant(app, name, FakeClock()), app.test_client()


# ------------------------------------------------------------------------------- validate


BROKEN = {
    "agents/a.yaml": agent_doc("a"),
    "agents/dup.yaml": agent_doc("a"),
    "policies/bad.yaml": """
        apiVersion: agentauth/v1
        kind: Policy
        metadata:
          name: bad
        spec:
          agent: a
          priority: 5
          colour: blue
          rules:
            - type: parameter_constraint
              parameters:
                amount: {min: 10, max: 1}
                iban: {regex: "([a-z"}
            - type: time_based
              timeWindow: {timezone: Mars/Olympus, allowedHours: [25]}
        """,
    "policies/orphan.yaml": """
        apiVersion: agentauth/v1
        kind: Policy
        metadata: {name: orphan}
        spec: {agent: nobody, rules: [{type: tool_allowlist}]}
        """,
    "policies/dupkey.yaml": """
        apiVersion: agentauth/v1
        kind: Agent
        metadata: {name: x}
        metadata: {name: y}
        spec: {}
        """,
    "policies/list.yaml": "- just\n- a list\n",
    "policies/bomb.yaml": """
        a: &a [x, x, x, x, x, x, x, x, x, x]
        b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]
        c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]
        d: [*c, *c]
        """,
    "policies/syntax.yaml": "apiVersion: agentauth/v1\nkind: [unclosed\n",
}


def test_validate_reports_every_problem_sorted_with_file_line_and_column(cli, repo_dir):
    write_files(repo_dir, BROKEN)
    result = cli("validate", repo_dir, db=False)
    assert result.exit_code == 1
    lines = [line for line in result.stdout.splitlines() if line]
    expected = [
        "agents/dup.yaml:4:3: metadata.name: duplicate Agent name 'a' (first declared at "
        "agents/a.yaml:4)",
        "policies/bad.yaml:8:3: spec.colour: unknown field",
        "policies/bad.yaml:12:18: spec.rules[0].parameters.amount.min: must not be greater "
        "than max",
        "policies/bad.yaml:15:59: spec.rules[1].timeWindow.allowedHours[0]: must be at most 23",
        "policies/bad.yaml:15:20: spec.rules[1].timeWindow.timezone: is not an IANA time zone name",
        "policies/bomb.yaml:1:23: $: aliases expand to more than 1000 nodes",
        "policies/dupkey.yaml:4:1: $: duplicate key 'metadata' in the document",
        "policies/list.yaml:1:1: $: document 1 is a list; expected a mapping with apiVersion, "
        "kind, metadata and spec",
        "policies/orphan.yaml:4:8: spec.agent: no Agent document declares 'nobody'",
    ]
    for line in expected:
        assert line in lines, f"missing: {line}\n---\n{result.stdout}"
    # ours up to the colon, then the reason in RE2's or PyYAML's words (theirs to change); the
    # position of a syntax error is where PyYAML noticed it, so only the file is ours there
    ours_then_theirs = [
        r"policies/bad\.yaml:13:16: spec\.rules\[0\]\.parameters\.iban\.regex: "
        r"is not a valid RE2 pattern: \S",
        r"policies/syntax\.yaml:\d+:\d+: \$: is not valid YAML: \S",
    ]
    for pattern in ours_then_theirs:
        assert any(re.match(pattern, line) for line in lines), f"missing: {pattern}"
    assert lines == sorted(lines, key=_sort_key)
    assert "error(s)" in result.stderr


def _deep_agent(levels: int) -> dict[str, str]:
    """An Agent whose description holds ``levels`` nested lists (it starts 2 levels deep)."""
    deep = "[" * levels + "]" * levels
    head = "apiVersion: agentauth/v1\nkind: Agent\nmetadata: {name: d}\n"
    return {"agents/deep.yaml": head + f"spec: {{description: {deep}}}\n"}


@pytest.mark.parametrize("levels", [65, 300, 2_000, 200_000], ids=["65", "300", "2000", "200000"])
def test_deeply_nested_files_are_refused_with_a_clear_message(cli, repo_dir, levels):
    """Past 64 levels a file is refused where it goes too deep, whatever the depth: no
    traceback, no crash of the composer (recursive in C) on 200,000 levels."""
    write_files(repo_dir, _deep_agent(levels))
    result = cli("validate", repo_dir, db=False)
    assert result.exit_code == 1
    assert result.stdout.splitlines() == [
        "agents/deep.yaml:4:84: $: nests more than 64 levels deep"
    ]


def test_sixty_four_levels_are_still_read(cli, repo_dir):
    write_files(repo_dir, _deep_agent(62))  # the innermost list sits at depth 64
    result = cli("validate", repo_dir, db=False)
    assert result.exit_code == 1
    assert "spec.description: must be a string or null" in result.stdout


def _sort_key(line: str) -> tuple[str, int]:
    file, line_no, *_ = line.split(":")
    return file, int(line_no)


def test_validate_warns_but_passes_on_unanchored_regex_and_unreachable_rule(cli, repo_dir):
    write_files(
        repo_dir,
        {
            "agents/a.yaml": agent_doc("a"),
            "policies/p.yaml": """
                apiVersion: agentauth/v1
                kind: Policy
                metadata: {name: open}
                spec:
                  agent: a
                  rules:
                    - type: tool_allowlist
                      tools: [email.send]
                    - type: parameter_constraint
                      tools: [email.send]
                      parameters: {to: {regex: "@example\\\\.com"}}
                ---
                apiVersion: agentauth/v1
                kind: Policy
                metadata: {name: lockdown}
                spec:
                  agent: a
                  priority: 100
                  rules: [{type: tool_denylist, tools: ["*"]}]
                """,
        },
    )
    result = cli("validate", repo_dir, db=False)
    assert result.exit_code == 0, result.output
    assert "spec.rules[1].parameters.to.regex: regex is not anchored" in result.stdout
    assert "policies/p.yaml:7:7: spec.rules[0]:" in result.stdout
    assert "lockdown" in result.stdout
    assert "(warning)" in result.stdout
    assert "0 error(s), 3 warning(s)" in result.stderr


def test_validate_clean_repository(cli, repo_dir):
    write_files(repo_dir, BASE)
    result = cli("validate", repo_dir, db=False)
    assert result.exit_code == 0
    assert result.stdout == ""
    assert "3 file(s): 0 error(s), 0 warning(s)" in result.stderr


def test_validate_missing_directory_is_a_clear_error(cli, tmp_path):
    result = cli("validate", tmp_path / "nope", db=False)
    assert result.exit_code == 1
    assert "is not a directory" in result.stderr


# ------------------------------------------------------------------------ plan and apply


def test_apply_creates_managed_objects_and_second_apply_changes_nothing(
    cli, repo_dir, ws_name, database_url
):
    write_files(repo_dir, BASE)
    first = cli("apply", repo_dir, "--workspace", ws_name)
    assert first.exit_code == 0, first.output
    assert "Plan: 3 to create, 0 to update, 0 to delete." in first.stdout
    second = cli("apply", repo_dir, "--workspace", ws_name)
    assert second.exit_code == 0
    assert "Plan: no changes." in second.stdout
    assert "already applied" in second.stdout
    plan = cli("plan", repo_dir, "--workspace", ws_name, "--detailed-exitcode")
    assert plan.exit_code == 0
    assert "no changes" in plan.stdout

    repo = load_repo(read_files(repo_dir), ws_name)
    agents, policies = _rows(database_url, repo.workspace_id)
    assert [(a.id, a.name, a.status, a.managed_by) for a in agents] == [
        (repo.agents["finance-agent"].id, "finance-agent", "active", "git")
    ]
    assert {p.name: (p.id, p.priority, p.managed_by) for p in policies} == {
        "no-shell": (repo.policies["no-shell"].id, 100, "git"),
        "refunds": (repo.policies["refunds"].id, 10, "git"),
    }
    status = _status(database_url, repo.workspace_id)
    assert status is not None
    assert status.result == "unchanged"
    assert status.applied_revision == status.attempted_revision
    assert status.applied_revision.startswith("sha256:")


def test_ids_are_the_same_in_every_database(cli, repo_dir, tmp_path):
    write_files(repo_dir, BASE)
    for name in ("one", "two"):
        url = f"sqlite:///{tmp_path / name}.db"
        assert cli("apply", repo_dir, "--db", url, db=False).exit_code == 0
    ids = []
    for name in ("one", "two"):
        db = Database(Settings(database_url=f"sqlite:///{tmp_path / name}.db"))
        with db.transaction() as session:
            ids.append(sorted(p.id for p in session.query(Policy)))
        db.dispose()
    assert ids[0] == ids[1]
    assert len(ids[0]) == 2


def test_plan_exit_codes(cli, repo_dir, ws_name):
    write_files(repo_dir, BASE)
    assert cli("plan", repo_dir, "--workspace", ws_name).exit_code == 0
    assert cli("plan", repo_dir, "--workspace", ws_name, "--detailed-exitcode").exit_code == 2
    write_files(repo_dir, {"policies/refunds.yaml": REFUNDS.replace("max: 500", "max: '500'")})
    broken = cli("plan", repo_dir, "--workspace", ws_name, "--detailed-exitcode")
    assert broken.exit_code == 1
    assert "spec.rules[1].parameters.amount.max: must be a number" in broken.stdout


def _change_everything(repo_dir: Path) -> None:
    """The second revision of the golden scenario: a rule member, a rule added, a policy
    removed, an agent added with its policy."""
    write_files(
        repo_dir,
        {
            "policies/refunds.yaml": REFUNDS.replace("max: 500", "max: 900")
            + """
    - type: rate_limit
      tools: ["payments.refund"]
      rateLimit: {maxCalls: 20, windowSeconds: 3600}
""",
            "policies/no-shell.yaml": None,
            "agents/support.yaml": agent_doc("support-bot", "status: active"),
            "policies/support.yaml": """
                apiVersion: agentauth/v1
                kind: Policy
                metadata: {name: tickets}
                spec:
                  agent: support-bot
                  rules: [{type: tool_allowlist, tools: ["tickets.*"]}]
                """,
        },
    )


@pytest.mark.parametrize("fmt", ["text", "markdown", "json"])
def test_plan_output_matches_golden_file(cli, repo_dir, database_url, fmt, update_golden):
    workspace = f"golden-{fmt}"  # fixed: ids in the output derive from it
    write_files(repo_dir, BASE)
    assert cli("apply", repo_dir, "--workspace", workspace).exit_code == 0
    tenant, client = _tenant(database_url, workspace)
    repo = load_repo(read_files(repo_dir), workspace)
    headers = tenant.headers("admin")
    # drift: someone edits a managed policy through the API
    policy_id = repo.policies["refunds"].id
    response = client.patch(f"/v1/policies/{policy_id}", json={"priority": 50}, headers=headers)
    assert response.status_code == 200
    # and creates an agent the repository is about to declare
    assert (
        client.post("/v1/agents", json={"name": "support-bot"}, headers=headers).status_code == 201
    )
    _change_everything(repo_dir)
    result = cli("plan", repo_dir, "--workspace", workspace, "--format", fmt, "--replay", "0")
    assert result.exit_code == 1, result.output  # shown, and refused for its conflict
    output = _normalise(result.stdout, fmt)
    if fmt == "json":  # one line on stdout; kept indented on disk so a change reads as a diff
        output = json.dumps(json.loads(output), indent=2, sort_keys=True) + "\n"
    golden = GOLDEN / f"plan.{ {'text': 'txt', 'markdown': 'md', 'json': 'json'}[fmt] }"
    if update_golden:
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(output, encoding="utf-8")
    assert output == golden.read_text(encoding="utf-8")


def _normalise(output: str, fmt: str) -> str:
    """The unmanaged agent's id is random (version 4): the one part of the output that may
    differ between runs. Ids the repository derives (version 5) stay."""
    uuid4 = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}"
    return re.sub(uuid4, "<random id>", output)


def test_plan_shows_rule_member_level_changes_and_drift(cli, repo_dir, ws_name, database_url):
    write_files(repo_dir, BASE)
    assert cli("apply", repo_dir, "--workspace", ws_name).exit_code == 0
    tenant, client = _tenant(database_url, ws_name)
    repo = load_repo(read_files(repo_dir), ws_name)
    client.patch(
        f"/v1/policies/{repo.policies['refunds'].id}",
        json={"priority": 50},
        headers=tenant.headers("admin"),
    )
    _change_everything(repo_dir)
    result = cli("plan", repo_dir, "--workspace", ws_name, "--format", "json", "--replay", "0")
    plan = json.loads(result.stdout)
    assert plan["format_version"] == 1
    refunds = next(c for c in plan["changes"] if c["name"] == "refunds")
    assert refunds["action"] == "update"
    assert refunds["drift"] is True
    fields = {f["path"]: f for f in refunds["fields"]}
    assert fields["rules[1].parameters.amount.max"] == {
        "path": "rules[1].parameters.amount.max",
        "drift": False,
        "before": 500,
        "after": 900,
    }
    assert fields["rules[2]"]["after"]["type"] == "rate_limit"
    assert "before" not in fields["rules[2]"]
    assert fields["priority"] == {"path": "priority", "drift": True, "before": 50, "after": 10}
    actions = {(c["kind"], c["name"]): c["action"] for c in plan["changes"]}
    assert actions[("Policy", "no-shell")] == "delete"
    assert actions[("Agent", "support-bot")] == "create"
    assert plan["summary"]["delete"] == 1
    assert plan["has_changes"] is True


def test_drift_is_repaired_by_apply(cli, repo_dir, ws_name, database_url):
    write_files(repo_dir, BASE)
    cli("apply", repo_dir, "--workspace", ws_name)
    tenant, client = _tenant(database_url, ws_name)
    repo = load_repo(read_files(repo_dir), ws_name)
    headers = tenant.headers("admin")
    refunds = repo.policies["refunds"].id
    client.patch(
        f"/v1/policies/{refunds}", json={"rules": [{"type": "tool_allowlist"}]}, headers=headers
    )
    client.delete(f"/v1/policies/{repo.policies['no-shell'].id}", headers=headers)
    plan = cli("plan", repo_dir, "--workspace", ws_name)
    assert "[drift: changed outside the repository]" in plan.stdout
    assert "drift: deleted outside the repository" in plan.stdout
    assert cli("apply", repo_dir, "--workspace", ws_name).exit_code == 0
    assert "no changes" in cli("plan", repo_dir, "--workspace", ws_name).stdout
    restored = client.get(f"/v1/policies/{refunds}", headers=headers).json
    assert restored["rules"] == repo.policies["refunds"].rules


def test_agent_suspended_through_the_api_stays_suspended(cli, repo_dir, ws_name, database_url):
    write_files(repo_dir, BASE)
    cli("apply", repo_dir, "--workspace", ws_name)
    tenant, client = _tenant(database_url, ws_name)
    agent_id = load_repo(read_files(repo_dir), ws_name).agents["finance-agent"].id
    headers = tenant.headers("admin")
    client.patch(f"/v1/agents/{agent_id}", json={"status": "suspended"}, headers=headers)
    write_files(repo_dir, {"policies/refunds.yaml": REFUNDS.replace("max: 500", "max: 501")})
    assert cli("apply", repo_dir, "--workspace", ws_name).exit_code == 0
    assert client.get(f"/v1/agents/{agent_id}", headers=headers).json["status"] == "suspended"
    # a file that states the status enforces it
    write_files(repo_dir, {"agents/finance.yaml": agent_doc("finance-agent", "status: active")})
    assert cli("apply", repo_dir, "--workspace", ws_name).exit_code == 0
    assert client.get(f"/v1/agents/{agent_id}", headers=headers).json["status"] == "active"


def test_pruning_deletes_policies_and_keeps_agents_without_the_flag(
    cli, repo_dir, ws_name, database_url
):
    write_files(repo_dir, BASE)
    cli("apply", repo_dir, "--workspace", ws_name)
    workspace_id = load_repo(read_files(repo_dir), ws_name).workspace_id
    write_files(repo_dir, {name: None for name in BASE})
    write_files(repo_dir, {"agents/other.yaml": agent_doc("other")})
    kept = cli("apply", repo_dir, "--workspace", ws_name)
    assert kept.exit_code == 0, kept.output
    assert "= Agent finance-agent" in kept.stdout
    assert "--prune-agents" in kept.stdout
    agents, policies = _rows(database_url, workspace_id)
    assert sorted(a.name for a in agents) == ["finance-agent", "other"]
    assert policies == []
    pruned = cli("apply", repo_dir, "--workspace", ws_name, "--prune-agents")
    assert pruned.exit_code == 0
    assert "- Agent finance-agent" in pruned.stdout
    agents, _ = _rows(database_url, workspace_id)
    assert [a.name for a in agents] == ["other"]


def test_unmanaged_objects_are_never_touched(cli, repo_dir, ws_name, database_url):
    tenant, client = _tenant(database_url, ws_name)
    headers = tenant.headers("admin")
    mine = client.post("/v1/agents", json={"name": "hand-made"}, headers=headers).json
    write_files(repo_dir, BASE)
    cli("apply", repo_dir, "--workspace", ws_name, "--prune-agents")
    write_files(repo_dir, {name: None for name in BASE})
    write_files(repo_dir, {"agents/x.yaml": agent_doc("x")})
    cli("apply", repo_dir, "--workspace", ws_name, "--prune-agents")
    assert client.get(f"/v1/agents/{mine['id']}", headers=headers).status_code == 200


def test_conflicts_block_apply_until_adopted(cli, repo_dir, ws_name, database_url):
    tenant, client = _tenant(database_url, ws_name)
    headers = tenant.headers("admin")
    existing = client.post("/v1/agents", json={"name": "finance-agent"}, headers=headers).json
    write_files(repo_dir, BASE)
    plan = cli("plan", repo_dir, "--workspace", ws_name)
    assert "! Agent finance-agent" in plan.stdout
    assert f"set metadata.id: {existing['id']}" in plan.stdout
    refused = cli("apply", repo_dir, "--workspace", ws_name)
    assert refused.exit_code == 1
    assert "conflict" in refused.stderr
    assert client.get("/v1/policies", headers=headers).json["data"] == []
    pinned = agent_doc("finance-agent", "description: pays refunds").replace(
        "name: finance-agent", f"name: finance-agent\n      id: {existing['id']}"
    )
    write_files(repo_dir, {"agents/finance.yaml": pinned})
    assert cli("apply", repo_dir, "--workspace", ws_name).exit_code == 1
    adopted = cli("apply", repo_dir, "--workspace", ws_name, "--adopt")
    assert adopted.exit_code == 0, adopted.output
    agent = client.get(f"/v1/agents/{existing['id']}", headers=headers).json
    assert agent["managedBy"] == "git"
    assert agent["description"] == "pays refunds"  # adopted and made what the file says
    assert len(client.get("/v1/policies", headers=headers).json["data"]) == 2
    assert "Plan: no changes." in cli("plan", repo_dir, "--workspace", ws_name).stdout


def test_sync_status_after_adopting_reports_what_was_applied(cli, repo_dir, ws_name, database_url):
    """An adopted conflict was applied: the run's record counts it as an update."""
    tenant, client = _tenant(database_url, ws_name)
    existing = client.post(
        "/v1/agents", json={"name": "finance-agent"}, headers=tenant.headers("admin")
    ).json
    pinned = agent_doc("finance-agent", "description: pays refunds").replace(
        "name: finance-agent", f"name: finance-agent\n      id: {existing['id']}"
    )
    write_files(repo_dir, {**BASE, "agents/finance.yaml": pinned})
    adopted = cli("apply", repo_dir, "--workspace", ws_name, "--adopt")
    assert adopted.exit_code == 0, adopted.output
    assert adopted.stdout.startswith("Plan: 2 to create, 1 to update, 0 to delete.\n")
    assert "~ Agent finance-agent" in adopted.stdout
    status = client.get("/v1/sync-status", headers=tenant.headers("read-only")).json
    assert status["result"] == "applied"
    assert status["changes"] == {
        "create": 2,
        "update": 1,
        "delete": 0,
        "orphan": 0,
        "conflict": 0,
        "drift": 0,
    }


def test_broken_revision_applies_nothing_and_the_last_good_one_stays(
    cli, repo_dir, ws_name, database_url
):
    write_files(repo_dir, BASE)
    cli("apply", repo_dir, "--workspace", ws_name)
    repo = load_repo(read_files(repo_dir), ws_name)
    good = _status(database_url, repo.workspace_id)
    assert good is not None
    write_files(
        repo_dir,
        {
            "policies/no-shell.yaml": None,
            "policies/refunds.yaml": REFUNDS.replace("EUR", "[EUR"),
        },
    )
    result = cli("apply", repo_dir, "--workspace", ws_name)
    assert result.exit_code == 1
    assert "was not applied" in result.stderr
    _agents, policies = _rows(database_url, repo.workspace_id)
    assert sorted(p.name for p in policies) == ["no-shell", "refunds"]
    status = _status(database_url, repo.workspace_id)
    assert status is not None
    assert status.result == "failed"
    assert "problem" in (status.error or "")
    assert status.applied_revision == good.applied_revision
    assert status.attempted_revision != good.applied_revision


def test_a_folder_without_agents_is_never_applied(cli, repo_dir, ws_name, database_url):
    write_files(repo_dir, BASE)
    cli("apply", repo_dir, "--workspace", ws_name)
    empty = repo_dir.parent / "empty"
    empty.mkdir()
    result = cli("apply", empty, "--workspace", ws_name)
    assert result.exit_code == 1
    assert "declares no agents" in result.stderr
    _, policies = _rows(database_url, load_repo([], ws_name).workspace_id)
    assert len(policies) == 2


def test_diff_of_a_missing_folder_says_so(cli, tmp_path):
    work = git.Repo.init(tmp_path / "repo")
    root = Path(work.working_tree_dir)
    write_files(root / "policies", BASE)
    work.git.add(A=True)
    work.index.commit("base")
    result = cli("diff", "HEAD", "HEAD", "--repo", root, "--path", "polices", db=False)
    assert result.exit_code == 1
    assert "'polices' does not exist at revision 'HEAD'" in result.stderr


def test_a_failure_mid_apply_leaves_nothing_half_applied(repo_dir, ws_name, database_url):
    write_files(repo_dir, BASE)
    db = _db(database_url)
    repo = load_repo(read_files(repo_dir), ws_name)
    seen = []

    def fail_on_third(change):
        seen.append(change.name)
        if len(seen) == 3:
            raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError):
        apply_repo(
            db,
            repo,
            workspace=ws_name,
            revision="r1",
            source="test",
            now=utc_now(),
            after_change=fail_on_third,
        )
    db.dispose()
    assert seen == ["finance-agent", "no-shell", "refunds"]
    agents, policies = _rows(database_url, repo.workspace_id)
    assert agents == []
    assert policies == []


def test_sync_status_endpoint_reports_the_applied_revision(cli, repo_dir, ws_name, database_url):
    tenant, client = _tenant(database_url, ws_name)
    headers = tenant.headers("read-only")
    empty = client.get("/v1/sync-status", headers=headers)
    assert empty.status_code == 200
    assert empty.json["lastAppliedRevision"] is None
    write_files(repo_dir, BASE)
    cli("apply", repo_dir, "--workspace", ws_name)
    status = client.get("/v1/sync-status", headers=headers).json
    assert status["result"] == "applied"
    assert status["lastAppliedRevision"].startswith("sha256:")
    assert status["changes"]["create"] == 3
    assert status["source"] == str(repo_dir.resolve())
    assert client.get("/v1/sync-status").status_code == 401


def test_metrics_show_the_revision_in_force_per_workspace(cli, repo_dir, ws_name, database_url):
    tenant, client = _tenant(database_url, ws_name)
    write_files(repo_dir, BASE)
    cli("apply", repo_dir, "--workspace", ws_name)
    revision = client.get("/v1/sync-status", headers=tenant.headers("read-only")).json[
        "lastAppliedRevision"
    ]
    text = client.get("/metrics").get_data(as_text=True)
    assert (
        f'agentauth_sync_last_applied_info{{revision="{revision}",workspace="{tenant.id}"}} 1.0'
        in text
    )
    assert f'agentauth_sync_last_success_timestamp_seconds{{workspace="{tenant.id}"}}' in text


def test_apply_in_a_git_work_tree_records_the_commit(cli, tmp_path, database_url):
    work = git.Repo.init(tmp_path / "work")
    folder = Path(work.working_tree_dir) / "policies"
    write_files(folder, BASE)
    work.index.add([str(p) for p in folder.rglob("*.yaml")])
    commit = work.index.commit("policies").hexsha
    ws = "git-rev-" + commit[:8]
    assert cli("apply", folder, "--workspace", ws).exit_code == 0
    status = _status(database_url, load_repo([], ws).workspace_id)
    assert status is not None
    assert status.applied_revision == commit
    write_files(folder, {"policies/refunds.yaml": REFUNDS.replace("500", "600")})
    assert cli("apply", folder, "--workspace", ws).exit_code == 0
    status = _status(database_url, load_repo([], ws).workspace_id)
    assert status is not None
    assert status.applied_revision.startswith(commit + "+dirty.")


# ------------------------------------------------------------------------------ impact


def test_plan_replays_recent_calls_and_counts_flips(cli, repo_dir, ws_name, database_url):
    write_files(repo_dir, BASE)
    cli("apply", repo_dir, "--workspace", ws_name)
    tenant, client = _tenant(database_url, ws_name)
    headers = tenant.headers("admin")
    agent_id = load_repo(read_files(repo_dir), ws_name).agents["finance-agent"].id
    for amount in (100, 400, 450, 700):
        client.post(
            "/v1/authorize",
            json={
                "agent_id": agent_id,
                "tool_name": "payments.refund",
                "parameters": {"amount": amount, "currency": "EUR"},
            },
            headers=headers,
        )
    write_files(repo_dir, {"policies/refunds.yaml": REFUNDS.replace("max: 500", "max: 300")})
    result = cli("plan", repo_dir, "--workspace", ws_name, "--format", "json")
    impact = json.loads(result.stdout)["impact"]
    assert impact[0]["agent"] == "finance-agent"
    assert impact[0]["replayed"] == 4
    assert impact[0]["allowed_to_denied"] == 2
    assert impact[0]["denied_to_allowed"] == 0
    assert {e["parameters"]["amount"] for e in impact[0]["examples"]} == {400, 450}
    text = cli("plan", repo_dir, "--workspace", ws_name).stdout
    assert "4 calls replayed; 2 allowed -> denied, 0 denied -> allowed" in text
    skipped = cli("plan", repo_dir, "--workspace", ws_name, "--format", "json", "--replay", "0")
    assert json.loads(skipped.stdout)["impact"] == []


# -------------------------------------------------------------------------------- diff


def test_diff_between_two_commits_needs_no_database(cli, tmp_path):
    work = git.Repo.init(tmp_path / "repo")
    root = Path(work.working_tree_dir)
    write_files(root / "policies", BASE)
    write_files(root, {"README.md": "not a policy\n"})
    work.git.add(A=True)
    base = work.index.commit("base").hexsha
    _change_everything(root / "policies")
    work.git.add(A=True)
    work.index.commit("head")
    result = cli("diff", base, "HEAD", "--repo", root, "--path", "policies", db=False)
    assert result.exit_code == 0, result.output
    assert "Plan: 2 to create, 1 to update, 1 to delete." in result.stdout
    assert "rules[1].parameters.amount.max: 500 -> 900" in result.stdout
    assert "- Policy no-shell" in result.stdout
    markdown = cli(
        "diff", base, "HEAD", "--repo", root, "--path", "policies", "--format", "markdown", db=False
    )
    assert markdown.stdout.startswith(f"### agentauth diff {base}..HEAD: 2 to create")
    same = cli("diff", "HEAD", "HEAD", "--repo", root, "--path", "policies",
               "--detailed-exitcode", db=False)  # fmt: skip
    assert same.exit_code == 0
    assert "no changes" in same.stdout
    changed = cli("diff", base, "HEAD", "--repo", root, "--path", "policies",
                  "--detailed-exitcode", db=False)  # fmt: skip
    assert changed.exit_code == 2
    unknown = cli("diff", "nope", "HEAD", "--repo", root, db=False)
    assert unknown.exit_code == 1
    assert "unknown revision 'nope'" in unknown.stderr


def test_cache_makes_unchanged_files_free_and_follows_changes(repo_dir, tmp_path):
    from controller.cache import DocumentCache

    write_files(repo_dir, BASE)
    cache_file = tmp_path / "c.json"
    first = load_repo(read_files(repo_dir), "w", DocumentCache(cache_file))
    assert cache_file.exists()
    cached = DocumentCache(cache_file)
    files = read_files(repo_dir)
    again = load_repo(files, "w", cached)
    assert again.policies.keys() == first.policies.keys()
    edited = [
        SourceFile(f.path, f.content.replace(b"max: 500", b"max: '500'"))
        if f.path == "policies/refunds.yaml"
        else f
        for f in files
    ]
    broken = load_repo(edited, "w", DocumentCache(cache_file))
    assert [p.path for p in broken.errors] == ["spec.rules[1].parameters.amount.max"]


def test_a_large_repository_is_parsed_in_worker_processes_with_the_same_result(tmp_path):
    """Past PARALLEL_FROM files the parsing runs in spawned processes; through ``python -m
    controller`` as a user runs it, so a worker that re-imported the CLI would show."""
    import subprocess
    import sys

    from controller.cache import PARALLEL_FROM

    repo = tmp_path / "big"
    files = {f"agents/a{i:04d}.yaml": agent_doc(f"a{i:04d}") for i in range(PARALLEL_FROM + 10)}
    files["agents/a0123.yaml"] = agent_doc("a0123", "colour: red")
    write_files(repo, files)
    env = {"AGENTAUTH_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    command = [sys.executable, "-m", "controller", "validate", str(repo)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 1, done.stderr
    assert done.stdout == "agents/a0123.yaml:5:8: spec.colour: unknown field\n"
    assert f"{PARALLEL_FROM + 10} file(s): 1 error(s), 0 warning(s)" in done.stderr
    again = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert again.stdout == done.stdout


def test_text_plans_are_colored_on_a_terminal_only(tmp_path):
    import os
    import pty
    import subprocess
    import sys

    work = git.Repo.init(tmp_path / "repo")
    root = Path(work.working_tree_dir)
    write_files(root, {"README.md": "policies to come\n"})
    work.git.add(A=True)
    base = work.index.commit("empty").hexsha
    write_files(root, BASE)
    work.git.add(A=True)
    work.index.commit("policies")
    command = [sys.executable, "-m", "controller", "diff", base, "HEAD", "--repo", str(root)]
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    piped = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert piped.returncode == 0, piped.stderr
    assert "\x1b[" not in piped.stdout
    leader, follower = pty.openpty()
    with subprocess.Popen(command, stdout=follower, stderr=subprocess.DEVNULL, env=env) as shown:
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal closed: the command is done
                break
            if not chunk:
                break
            chunks.append(chunk)
        os.close(leader)
    assert shown.returncode == 0
    colored = b"".join(chunks).decode()
    assert "\x1b[32m+ Agent finance-agent" in colored
    assert "Plan: 3 to create" in colored
