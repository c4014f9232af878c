"""Issue #22, finding 3: one workspace never reads another's objects, and an id of another
workspace pinned in a policy repository is refused.

Git-managed ids are UUIDv5 of (workspace, kind, name), so anyone can compute another
workspace's ids. A repository whose Agent pins ``metadata.id`` to an agent of workspace A,
planned for workspace B, used to replay A's recorded calls through A's live policies and print
A's tool names, parameters, policy names and reasons. Here, on both databases: ``plan`` and
``apply`` refuse such an id with a message naming the file and the id (exit 1, nothing written),
the impact replay reads nothing of another workspace even when asked to, and every read
function of the storage layer, called with one workspace's id and another's object ids, finds
nothing.
"""

from __future__ import annotations

import base64
import dataclasses
import importlib
import inspect
import json
import pkgutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import git
import pytest
from click.testing import Result
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controller.impact import analyse
from controller.plan import Action, build_plan
from controller.repo import load_repo
from controller.sources import read_files
from controller.state import read_live
from core.config import Settings
from core.domain import ids
from core.domain.errors import NotFound
from core.hotpath import approvals as deciding
from core.hotpath.decisions import load_policies
from core.hotpath.reads import Reads
from core.hotpath.usage import usage
from core.store import (
    agents,
    approvals,
    audit,
    auditcounts,
    auditpages,
    auditstats,
    chain,
    keys,
    policies,
    retention,
    shadow,
    sync_status,
    webhooks,
)
from core.store.database import Database
from core.store.keys import ensure_workspace
from core.store.models import (
    Agent,
    ApiKey,
    Approval,
    AuditEntry,
    AuditHead,
    Policy,
    SyncStatus,
    Webhook,
    WebhookDelivery,
)
from tests.api.helpers import decide, make_agent
from tests.conftest import Tenant
from tests.controller.conftest import write_files

#: what workspace A's history holds; none of it may show in workspace B's plan
A_TOOL = "ledger.export_everything"
A_PARAMETER = "acct-of-workspace-a-4242"
A_POLICY = "workspace-a-ledger-policy"

AGENT = """
apiVersion: agentauth/v1
kind: Agent
metadata:
  name: billing-agent
  id: {id}
spec: {{}}
"""
POLICY = """
apiVersion: agentauth/v1
kind: Policy
metadata:
  name: billing-reads
{pin}spec:
  agent: billing-agent
  rules:
    - {{type: tool_allowlist, tools: [ledger.read]}}
"""


@pytest.fixture
def ws_name(other_workspace: Tenant) -> str:
    """Workspace B, where the repository is planned and applied."""
    return other_workspace.name


@pytest.fixture
def victim(client: Any, workspace: Tenant) -> dict[str, str]:
    """Workspace A: an agent with a policy, and recorded calls the policy allowed."""
    headers = workspace.headers("admin")
    rules = [{"type": "tool_allowlist", "tools": [A_TOOL]}]
    agent_id = make_agent(client, headers, "billing-agent", rules)
    policy = client.get(f"/v1/policies?agent_id={agent_id}", headers=headers).json["data"][0]
    renamed = client.patch(f"/v1/policies/{policy['id']}", json={"name": A_POLICY}, headers=headers)
    assert renamed.status_code == 200, renamed.get_data(as_text=True)
    for _ in range(3):
        assert decide(client, headers, agent_id, A_TOOL, account=A_PARAMETER)["allowed"]
    return {"agent": agent_id, "policy": policy["id"]}


def git_repo(root: Path, files: dict[str, str]) -> Path:
    """A git work tree holding ``files``, committed."""
    work = git.Repo.init(root)
    folder = Path(str(work.working_tree_dir))
    write_files(folder, files)
    work.git.add(A=True)
    work.index.commit("policies")
    return folder


def counts(database_url: str, workspace_id: str) -> tuple[int, int]:
    db = Database(Settings(database_url=database_url))
    try:
        with db.transaction() as session:
            found = tuple(
                session.scalar(
                    select(func.count())
                    .select_from(model)
                    .where(model.workspace_id == workspace_id)
                )
                or 0
                for model in (Agent, Policy)
            )
    finally:
        db.dispose()
    return found  # type: ignore[return-value]


def assert_no_trace_of_a(result: Result) -> None:
    for secret in (A_TOOL, A_PARAMETER, A_POLICY):
        assert secret not in result.output
        assert secret not in result.stderr


# ------------------------------------------------------------- plan and apply (the CLI)


@pytest.mark.parametrize("fmt", ["json", "text", "markdown"])
def test_plan_refuses_an_agent_id_of_another_workspace_and_shows_none_of_its_history(
    cli, tmp_path, victim, ws_name, fmt
):
    repo = git_repo(
        tmp_path / "repo",
        {"agents.yaml": AGENT.format(id=victim["agent"]), "reads.yaml": POLICY.format(pin="")},
    )
    result = cli("plan", repo, "--workspace", ws_name, "--format", fmt)
    assert result.exit_code == 1, result.output
    assert_no_trace_of_a(result)
    if fmt == "json":
        changes = json.loads(result.stdout)["changes"]
        [refused] = [c for c in changes if c["action"] == "conflict"]
        assert refused["kind"] == "Agent"
        assert refused["before"] is None  # nothing of A's agent
        assert json.loads(result.stdout).get("impact") in (None, [])
        note = refused["note"]
    else:
        note = result.stdout
    assert f"agents.yaml:5: metadata.id {victim['agent']}" in note  # the line of the id
    assert "another workspace" in note


def test_apply_refuses_an_agent_id_of_another_workspace_and_changes_nothing(
    cli, tmp_path, victim, ws_name, workspace, database_url
):
    repo = git_repo(
        tmp_path / "repo",
        {"agents.yaml": AGENT.format(id=victim["agent"]), "reads.yaml": POLICY.format(pin="")},
    )
    before = counts(database_url, workspace.id)
    result = cli("apply", repo, "--workspace", ws_name)
    assert result.exit_code == 1, result.output
    assert "agents.yaml" in result.stderr
    assert victim["agent"] in result.stderr
    assert "another workspace" in result.stderr
    assert "nothing was applied" in result.stderr
    assert_no_trace_of_a(result)
    assert counts(database_url, ids.workspace_id(ws_name)) == (0, 0)
    assert counts(database_url, workspace.id) == before


def test_a_policy_id_of_another_workspace_is_refused_by_plan_and_apply(
    cli, tmp_path, victim, ws_name, workspace, database_url
):
    own_agent = ids.stable_id(ids.workspace_id(ws_name), "Agent", "billing-agent")
    repo = git_repo(
        tmp_path / "repo",
        {
            "agents.yaml": AGENT.format(id=own_agent),
            "reads.yaml": POLICY.format(pin=f"  id: {victim['policy']}\n"),
        },
    )
    planned = cli("plan", repo, "--workspace", ws_name, "--format", "json")
    assert planned.exit_code == 1, planned.output
    [refused] = [c for c in json.loads(planned.stdout)["changes"] if c["action"] == "conflict"]
    assert refused["kind"] == "Policy"
    assert f"reads.yaml:5: metadata.id {victim['policy']}" in refused["note"]
    assert_no_trace_of_a(planned)
    for adopting in ((), ("--adopt",)):  # another workspace's object is never adoptable
        before = counts(database_url, workspace.id)
        applied = cli("apply", repo, "--workspace", ws_name, *adopting)
        assert applied.exit_code == 1, applied.output
        assert "reads.yaml" in applied.stderr
        assert victim["policy"] in applied.stderr
        assert "another workspace" in applied.stderr
        assert "storage" not in applied.stderr.lower()
        assert counts(database_url, ids.workspace_id(ws_name)) == (0, 0)
        assert counts(database_url, workspace.id) == before


def test_an_id_derived_for_this_workspace_but_pinned_by_another_is_refused(
    cli, tmp_path, workspace, ws_name, database_url
):
    """Workspace A squats on the id B would derive for its agent: B's apply says so, rather
    than failing on the database's unique key."""
    squatted = ids.stable_id(ids.workspace_id(ws_name), "Agent", "billing-agent")
    theirs = git_repo(tmp_path / "a", {"agents.yaml": AGENT.format(id=squatted)})
    assert cli("apply", theirs, "--workspace", workspace.name).exit_code == 0
    ours = git_repo(
        tmp_path / "b",
        {
            "agents.yaml": AGENT.replace("  id: {id}\n", "").format(),
            "reads.yaml": POLICY.format(pin=""),
        },
    )
    for verb in ("plan", "apply"):
        result = cli(verb, ours, "--workspace", ws_name)
        assert result.exit_code == 1, result.output
        said = result.output + result.stderr
        assert f"agents.yaml:1: the id {squatted} derived for this agent" in said
        assert "storage" not in said.lower()
    assert counts(database_url, ids.workspace_id(ws_name)) == (0, 0)


def test_the_impact_replay_reads_only_the_planned_workspace(
    tmp_path, victim, ws_name, database_url
):
    """The replay's own reads are scoped: asked about another workspace's agent id (the
    refusal set aside), it finds no history and no live policies."""
    repo_dir = git_repo(
        tmp_path / "repo",
        {"agents.yaml": AGENT.format(id=victim["agent"]), "reads.yaml": POLICY.format(pin="")},
    )
    repo = load_repo(read_files(repo_dir), ws_name)
    db = Database(Settings(database_url=database_url))
    try:
        with db.transaction(write=True) as session:
            ensure_workspace(session, ws_name, NOW)
        with db.transaction() as session:
            unaware = build_plan(repo, read_live(session, repo.workspace_id))
            assert not unaware.of(Action.CONFLICT)  # planned as if the id were free
            assert analyse(session, repo, unaware, 10_000) == []
            aware = build_plan(repo, read_live(session, repo.workspace_id, repo))
            assert [c.id for c in aware.of(Action.CONFLICT)] == [victim["agent"]]
    finally:
        db.dispose()


# ------------------------------------------------------ every read of the storage layer

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
LATER = NOW + timedelta(days=365 * 50)  # every delivery is due by then
#: what a database-touching function is given its database by
DATABASE_PARAMETERS = {"session", "connection", "db", "batch", "reads"}
PACKAGES = ("core.store", "core.hotpath")


@dataclass(frozen=True)
class World:
    """One workspace holding one of everything, and the ids (and texts) that are its own."""

    workspace: str
    agent: str
    policy: str
    approval: str
    key: str
    webhook: str
    deliveries: tuple[str, ...]
    audit: tuple[str, ...]
    tool: str
    revision: str
    head: bytes

    def markers(self) -> set[str]:
        return {
            self.workspace, self.agent, self.policy, self.approval, self.key, self.webhook,
            *self.deliveries, *self.audit, self.tool, self.revision, self.head.hex(),
            base64.b64encode(self.head).decode(),
        }  # fmt: skip


def make_world(app: Any, client: Any, tenant: Tenant) -> World:
    db: Database = app.extensions["agentauth"].db
    headers = tenant.headers("admin")
    key = client.get("/v1/whoami", headers=headers).json["id"]
    revision = f"rev-{tenant.name}"
    with db.transaction(write=True) as session:
        wid = ensure_workspace(session, tenant.name, NOW)
        events = ["approval.requested", "approval.decided"]
        hook, _ = webhooks.create_webhook(
            session, wid, "https://hooks.example.com/in", events, None, NOW
        )
        session.add(
            SyncStatus(
                workspace_id=wid,
                source=f"/src/{tenant.name}",
                attempted_revision=revision,
                attempted_at=NOW,
                result="applied",
                applied_revision=revision,
                applied_at=NOW,
            )
        )
    tool = f"tool.{tenant.name}"
    rules = [
        {"type": "tool_allowlist", "tools": [tool, "read"]},
        {"type": "require_approval", "tools": [tool]},
        # a counter of the workspace's own, which an agent's usage shows (no call is counted)
        {
            "type": "budget",
            "tools": ["counted"],
            "per": "session",
            "budget": {"parameter": "n", "max": 10, "windowSeconds": 60},
        },
    ]
    agent = make_agent(client, headers, f"agent-{tenant.name}", rules)
    policy = client.get(f"/v1/policies?agent_id={agent}", headers=headers).json["data"][0]["id"]
    assert decide(client, headers, agent, "read")["allowed"]
    escalated = decide(client, headers, agent, tool, amount=1)
    assert escalated["outcome"] == "escalated", escalated
    # a policy on trial, which would deny the tool: the same call again has a would-be
    # decision, counted under the tool (decisions §10); it waits for the same approval
    trial = {"agent_id": agent, "name": f"trial-{tenant.name}", "mode": "shadow", "priority": 10,
             "rules": [{"type": "tool_denylist", "tools": [tool]}]}  # fmt: skip
    assert client.post("/v1/policies", json=trial, headers=headers).status_code == 201
    again = decide(client, headers, agent, tool, amount=1)
    assert again["approvalId"] == escalated["approvalId"], again
    with db.transaction() as session:
        audit_ids = session.scalars(select(AuditEntry.id).where(AuditEntry.workspace_id == wid))
        deliveries = session.scalars(
            select(WebhookDelivery.id).where(WebhookDelivery.webhook_id == hook.id)
        )
        head = session.get(AuditHead, wid)
        assert head is not None
        world = World(
            wid, agent, policy, escalated["approvalId"], key, hook.id, tuple(deliveries),
            tuple(audit_ids), tool, revision, bytes.fromhex(head.hash),
        )  # fmt: skip
    assert len(world.audit) == 3
    assert len(world.deliveries) == 1
    return world


@pytest.fixture
def worlds(app, client, workspace, other_workspace) -> tuple[World, World]:
    return make_world(app, client, workspace), make_world(app, client, other_workspace)


Read = Callable[[Session, World, World], Any]

#: every read: ``read(session, me, other)`` reads in ``me``'s workspace, naming ``other``'s
#: objects wherever it takes an id (or filters by one)
READS: dict[str, Read] = {
    "core.store.agents.list_agents": lambda s, me, other: agents.list_agents(
        s, me.workspace, 100, 0
    ),
    "core.store.agents.get_agent": lambda s, me, other: agents.get_agent(
        s, me.workspace, other.agent
    ),
    "core.store.policies.list_policies": lambda s, me, other: policies.list_policies(
        s, me.workspace, other.agent, 100, 0
    ),
    "core.store.policies.get_policy": lambda s, me, other: policies.get_policy(
        s, me.workspace, other.policy
    ),
    "core.store.approvals.query": lambda s, me, other: approvals.query(
        s, me.workspace, approvals.Filters(agent_id=other.agent), NOW, 100, 0
    ),
    "core.store.approvals.get": lambda s, me, other: approvals.get(s, me.workspace, other.approval),
    "core.store.audit.query": lambda s, me, other: audit.query(
        s, me.workspace, audit.Filters(agent_id=other.agent), 100, 0
    ),
    "core.store.audit.is_export_truncated": lambda s, me, other: audit.is_export_truncated(
        s, me.workspace, audit.Filters(agent_id=other.agent)
    ),
    "core.store.audit.export_rows": lambda s, me, other: audit.export_rows(
        s, me.workspace, audit.Filters()
    ),
    "core.store.auditstats.count": lambda s, me, other: auditstats.count(
        s, me.workspace, audit.Filters(agent_id=other.agent)
    ),
    "core.store.auditstats.series": lambda s, me, other: auditstats.series(
        s, me.workspace, audit.Filters(agent_id=other.agent), None, None, 3600, "agent"
    ),
    "core.store.auditpages.list_page": lambda s, me, other: auditpages.list_page(
        s, me.workspace, audit.Filters(agent_id=other.agent), 100
    ),
    "core.store.retention.pruned_head": lambda s, me, other: retention.pruned_head(s, me.workspace),
    "core.store.retention.plan": lambda s, me, other: retention.plan(s, me.workspace, LATER),
    "core.store.auditcounts.settled": lambda s, me, other: auditcounts.settled(
        s, me.workspace, 0, 2**40
    ),
    "core.store.retention.kept": lambda s, me, other: retention.kept(s, me.workspace),
    "core.store.retention.last_prune": lambda s, me, other: retention.last_prune(s, me.workspace),
    "core.store.chain.head": lambda s, me, other: chain.head(s, me.workspace),
    "core.store.chain.checkpoint": lambda s, me, other: chain.checkpoint(
        s, me.workspace, Ed25519PrivateKey.generate()
    ),
    "core.store.chain.entries": lambda s, me, other: chain.entries(s, me.workspace),
    "core.store.chain.verify": lambda s, me, other: chain.verify(s, me.workspace),
    "core.store.keys.list_keys": lambda s, me, other: keys.list_keys(s, me.workspace, 100, 0),
    "core.store.keys.get_key": lambda s, me, other: keys.get_key(s, me.workspace, other.key),
    "core.store.sync_status.read_status": lambda s, me, other: sync_status.read_status(
        s, me.workspace
    ),
    "core.store.webhooks.list_webhooks": lambda s, me, other: webhooks.list_webhooks(
        s, me.workspace, 100, 0
    ),
    "core.store.webhooks.find_webhook": lambda s, me, other: webhooks.find_webhook(
        s, me.workspace, other.webhook
    ),
    "core.store.webhooks.list_deliveries": lambda s, me, other: webhooks.list_deliveries(
        s, me.workspace, other.webhook, 100, 0
    ),
    "core.store.webhooks.find_due": lambda s, me, other: webhooks.find_due(
        s, LATER, 100, me.workspace
    ),
    "core.hotpath.decisions.load_policies": lambda s, me, other: load_policies(
        s.connection(), me.workspace, other.agent
    ),
    "core.hotpath.usage.usage": lambda s, me, other: usage(
        s, me.workspace, other.agent, NOW, "chat-1"
    ),
    "core.store.shadow.report": lambda s, me, other: shadow.report(
        s, me.workspace, other.policy, NOW - timedelta(days=7), NOW
    ),
    "core.store.shadow.counts": lambda s, me, other: shadow.counts(
        s, me.workspace, other.agent, None, None
    ),
}
#: reads whose answer holds no id or text of the objects behind it (a yes or no)
BLIND = {
    "core.store.audit.is_export_truncated",
    "core.store.auditstats.count",
    # where the chain was pruned, and the range a prune would take: sizes and hashes
    "core.store.retention.pruned_head",
    "core.store.retention.plan",
    # whether the workspace's tallies still count a range
    "core.store.auditcounts.settled",
    # what a log keeps: counts, seqs and the oldest entry's time; and the last prune's entry,
    # which these workspaces have none of (tests/api/test_audit_retention.py reads one)
    "core.store.retention.kept",
    "core.store.retention.last_prune",
}

#: every write that takes an object's id: from ``me``'s workspace, aimed at ``other``'s objects
WRITES: dict[str, Read] = {
    "core.store.agents.update_agent": lambda s, me, other: agents.update_agent(
        s, me.workspace, other.agent, {"name": "taken-over"}, NOW
    ),
    "core.store.agents.delete_agent": lambda s, me, other: agents.delete_agent(
        s, me.workspace, other.agent
    ),
    "core.store.audit.erase": lambda s, me, other: audit.erase(s, me.workspace, other.agent),
    "core.store.policies.create_policy": lambda s, me, other: policies.create_policy(
        s, me.workspace, {"agent_id": other.agent, "name": "planted", "rules": []}, NOW
    ),
    "core.store.policies.update_policy": lambda s, me, other: policies.update_policy(
        s, me.workspace, other.policy, {"name": "taken-over", "enabled": False}, NOW
    ),
    # both ways: another workspace's policy onto this one's agent, and this one's onto theirs
    "core.store.policies.move_policy": lambda s, me, other: [
        _not_found(policies.move_policy, s, me.workspace, other.policy, me.agent, NOW),
        policies.move_policy(s, me.workspace, me.policy, other.agent, NOW),
    ],
    "core.store.policies.delete_policy": lambda s, me, other: policies.delete_policy(
        s, me.workspace, other.policy
    ),
    "core.store.keys.revoke_key": lambda s, me, other: keys.revoke_key(
        s, me.workspace, other.key, NOW
    ),
    "core.store.webhooks.delete_webhook": lambda s, me, other: webhooks.delete_webhook(
        s, me.workspace, other.webhook
    ),
}
#: writes that may leave no trace of a refusal: they act on what matches, which is nothing
QUIET_WRITES = {"core.store.audit.erase"}

#: functions that create in the workspace they are given and name no existing object
CREATES = {
    "core.store.agents.create_agent",
    "core.store.keys.issue_key",
    "core.store.webhooks.create_webhook",
    "core.hotpath.approvals.enqueue",
    "core.store.auditcounts.add",
    # deletes the workspace's own entries up to its pruned head, naming nothing else
    "core.store.retention.remove",
    # deletes the workspace's own rollup rows of a range its prune emptied
    "core.store.auditcounts.forget",
}
#: scoped, checked by a test of its own below
OWN_TESTS = {"core.hotpath.approvals.decide": "test_deciding_another_workspaces_approval"}

#: functions not about one workspace, and why that is right
UNSCOPED = {
    "core.store.keys.authenticate": "finds the caller's workspace from the key itself",
    "core.store.keys.ensure_workspace": "a workspace by its own name",
    "core.store.approvals.pending_by_workspace": "metrics: counts per workspace id, no content",
    "core.store.sync_status.applied_revisions": "metrics: revisions per workspace id",
    "core.store.webhooks.lease": "the delivery worker serves every workspace's outbox",
    "core.store.webhooks.record_try": "the delivery worker, on a delivery it leased",
    "core.store.limits.consume": "a counter by name (a key's or a policy's id): no content",
    "core.store.limits.reset": "counters by name prefix, called with a scoped policy's id",
    "core.store.limits.stored": "a counter by name (a key's or a policy's id): no content",
    "core.store.limits.used": "a counter by name (a key's or a policy's id): no content",
    "core.store.limits.sweep_sessions": "ended windows of every workspace's session counters, "
    "counts only",
    "core.store.paging.paginate": "runs a query its caller built, scoped there",
    "core.store.auditcounts.fold": "moves every workspace's tallies into its own counts; "
    "reads out nothing",
    "core.store.auditcounts.drain": "folds every workspace's tallies, as fold",
    "core.store.paced.give_back": "SQLite's free pages to the file system: no rows",
    "core.store.partitions.is_partitioned": "the schema",
    "core.store.partitions.days": "the schema: the day partitions there are",
    "core.store.partitions.create": "the schema: empty day partitions",
    "core.store.partitions.ensure": "the schema: empty day partitions",
    "core.store.partitions.droppable": "the days in which no workspace keeps an entry: dates",
    "core.store.partitions.drop": "a day droppable() found no workspace keeps an entry in",
    "core.store.retention.write_archive": "archives the range of a Plan that plan() made for "
    "one workspace",
    "core.store.retention.record": "moves the pruned head of a Plan's own workspace",
    "core.store.database.check_connection": "the database itself, no rows",
    "core.store.migrate.upgrade": "the schema",
    "core.store.migrate.require_current": "the schema",
    "core.store.migrate.is_current": "the schema",
    "core.store.migrate.current_revision": "the schema",
    "core.hotpath.decisions.authorize": "the caller's workspace from its key (Principal); "
    "its reads are Reads.agent and load_policies, checked here",
}


def database_functions() -> dict[str, inspect.Signature]:
    """Every public module-level function of the storage layer and the hot path that is
    handed a database (a session, a connection, ...)."""
    found = {}
    for package_name in PACKAGES:
        package = importlib.import_module(package_name)
        for info in pkgutil.iter_modules(package.__path__):
            if info.ispkg:
                continue  # migrations
            module: ModuleType = importlib.import_module(f"{package_name}.{info.name}")
            for name, function in vars(module).items():
                if name.startswith("_") or not inspect.isfunction(function):
                    continue
                if function.__module__ != module.__name__:
                    continue
                signature = inspect.signature(function)
                if DATABASE_PARAMETERS & set(signature.parameters):
                    found[f"{module.__name__}.{name}"] = signature
    return found


def test_every_database_function_is_accounted_for():
    """A new read or write appears here and must say how it is scoped: a read of one
    workspace is walked below, a function about none says why."""
    registered = [*READS, *WRITES, *CREATES, *OWN_TESTS, *UNSCOPED]
    assert len(registered) == len(set(registered))
    assert set(registered) == set(database_functions())


def test_every_scoped_function_takes_the_workspace():
    functions = database_functions()
    for name, signature in functions.items():
        if name in UNSCOPED:
            continue
        assert "workspace_id" in signature.parameters, f"{name} reads without a workspace"
    for name in UNSCOPED:  # an id of an object, without its workspace, is what #22 was
        ids_taken = [p for p in functions[name].parameters if p.endswith(("_id", "_ids"))]
        assert name == "core.store.webhooks.lease" or not ids_taken, name


def seen(value: Any, depth: int = 0) -> list[str]:
    """Every text and number a read's answer holds (rows, pages, records, generators)."""
    assert depth < 30
    if isinstance(value, (str, int, float, bool)) or value is None:
        return [str(value)]
    if isinstance(value, (bytes, bytearray)):
        return [bytes(value).hex(), base64.b64encode(value).decode()]
    if isinstance(value, datetime):
        return [value.isoformat()]
    if hasattr(value, "__table__"):
        return [t for c in value.__table__.columns for t in seen(getattr(value, c.key), depth + 1)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [
            t for f in dataclasses.fields(value) for t in seen(getattr(value, f.name), depth + 1)
        ]
    if isinstance(value, dict):
        return [t for k, v in value.items() for t in seen(k, depth + 1) + seen(v, depth + 1)]
    if isinstance(value, Iterable):
        return [t for item in value for t in seen(item, depth + 1)]
    return [repr(value)]


def read(db: Database, function: Read, me: World, other: World) -> str | None:
    """The answer's texts, or None when it was not found."""
    with db.transaction() as session:
        try:
            return "\n".join(seen(function(session, me, other)))
        except NotFound:
            return None


@pytest.mark.parametrize("name", sorted(READS))
def test_a_read_in_one_workspace_finds_nothing_of_another(app, worlds, name):
    db: Database = app.extensions["agentauth"].db
    a, b = worlds
    answer = read(db, READS[name], a, b)
    if answer is not None:
        leaked = sorted(marker for marker in b.markers() if marker in answer)
        assert not leaked, f"{name} in workspace A shows B's {leaked}"
    # the same read in B's own workspace does find B's objects: the walk reads real data
    own = read(db, READS[name], b, b)
    assert own is not None, f"{name} does not find B's own object"
    assert name in BLIND or any(marker in own for marker in b.markers()), name


class _RolledBack(Exception):
    pass


def rows_of(session: Session, world: World) -> list[Any]:
    """Everything stored for the workspace, as plain rows (in the session: what it would
    commit)."""
    out: list[Any] = []
    for model in (Agent, Policy, AuditEntry, Approval, ApiKey, Webhook, SyncStatus):
        table = model.__table__
        query = select(table).where(table.c.workspace_id == world.workspace)
        out.append(sorted(tuple(map(str, row)) for row in session.execute(query)))
    deliveries = select(WebhookDelivery.__table__).where(
        WebhookDelivery.webhook_id == world.webhook
    )
    out.append(sorted(tuple(map(str, row)) for row in session.execute(deliveries)))
    return out


def _not_found(function: Callable[..., Any], *args: Any) -> None:
    with pytest.raises(NotFound):
        function(*args)


def attempt(db: Database, name: str, me: World, other: World) -> None:
    """Run the write, look at ``other``'s rows in the same transaction, then roll it back."""
    with db.transaction(write=True) as session:
        before = rows_of(session, other)
        try:
            WRITES[name](session, me, other)
        except NotFound:
            pass
        else:
            assert name in QUIET_WRITES, f"{name} from workspace A took B's object"
        assert rows_of(session, other) == before, f"{name} from workspace A changed B's rows"
        raise _RolledBack


@pytest.mark.parametrize("name", sorted(WRITES))
def test_a_write_in_one_workspace_cannot_touch_another(app, worlds, name):
    a, b = worlds
    with pytest.raises(_RolledBack):
        attempt(app.extensions["agentauth"].db, name, a, b)


def test_deciding_another_workspaces_approval_is_not_found(app, worlds):
    a, b = worlds
    recorder = app.extensions["agentauth"].recorder

    def job(batch: Any) -> Any:
        return deciding.decide(
            batch,
            recorder.statements.approvals,
            workspace_id=a.workspace,
            approval_id=b.approval,
            approve=True,
            key_id=a.key,
            comment=None,
            now=NOW,
        )

    with pytest.raises(NotFound):
        recorder.run(job)
    db: Database = app.extensions["agentauth"].db
    with db.transaction() as session:
        assert approvals.get(session, b.workspace, b.approval).status == "pending"


def test_the_hot_paths_agent_read_is_scoped(app, worlds):
    a, b = worlds
    reads = Reads(app.extensions["agentauth"].db.engine)
    try:
        assert reads.agent(b.agent, a.workspace) is None
        found = reads.agent(b.agent, b.workspace)
        assert found is not None
        assert found.id == b.agent
    finally:
        reads.close()
