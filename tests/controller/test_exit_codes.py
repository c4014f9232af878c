"""Every verb's exit codes, as one table (the README's): 0 success; 1 an error (problems in the
repository, a conflict apply would refuse, a failing policy test, an unknown revision, a
database that cannot be used); 2 changes, with ``--detailed-exitcode``; 2 bad usage (click)."""

from __future__ import annotations

import secrets
import textwrap
from dataclasses import dataclass
from pathlib import Path

import git
import pytest
from click.testing import CliRunner

from controller.cli import main
from controller.load import SourceFile
from controller.repo import load_repo
from core.config import Settings
from core.domain.clock import utc_now
from core.store import agents as agent_store
from core.store.database import Database
from core.store.keys import ensure_workspace
from tests.controller.conftest import agent_doc, write_files

REFUNDS = """
apiVersion: agentauth/v1
kind: Policy
metadata: {name: refunds}
spec:
  agent: finance-agent
  rules: [{type: tool_allowlist, tools: ["payments.refund"]}]
"""
CHECKS = """
apiVersion: agentauth/v1
kind: PolicyTest
metadata: {name: refunds}
spec:
  agent: finance-agent
  now: "2026-03-17T10:15:00Z"
  cases:
    - {tool: payments.refund, allowed: true}
    - {tool: shell.rm, allowed: false}
"""
REPO = {
    "agents/finance.yaml": agent_doc("finance-agent"),
    "policies/refunds.yaml": REFUNDS,
    "tests/refunds.yaml": CHECKS,
}
FAILING = {**REPO, "tests/refunds.yaml": CHECKS.replace("allowed: false", "allowed: true")}
BROKEN = {**REPO, "policies/refunds.yaml": REFUNDS.replace("tool_allowlist", "tool_alowlist")}
CHANGED = {**REPO, "policies/refunds.yaml": REFUNDS + "  priority: 5\n"}
UNUSABLE = "mysql://nobody@127.0.0.1/x"  # neither sqlite nor postgresql
UNREACHABLE = "postgresql://nobody@127.0.0.1:1/x"  # nothing listens on port 1

PLAN = ["plan", "{repo}", "--db", "{db}", "--replay", "0", "--workspace"]
DIFF = ["diff", "--repo", "{git}", "--path", "policies"]
APPLY = ["apply", "--db", "{db}", "--workspace"]
WATCH = ["watch", "--once", "--db", "{db}", "--workspace"]
KEYS = ["keys", "create", "--name", "ci"]

#: verb, situation, arguments ({...}: see World.values), exit code
TABLE = [
    ("validate", "valid", ["validate", "{repo}"], 0),
    ("validate", "problems", ["validate", "{broken}"], 1),
    ("validate", "missing folder", ["validate", "{missing}"], 1),
    ("validate", "bad usage", ["validate"], 2),
    ("test", "every case passes", ["test", "{repo}"], 0),
    ("test", "a case fails", ["test", "{failing}"], 1),
    ("test", "problems", ["test", "{broken}"], 1),
    ("test", "bad usage", ["test", "{repo}", "--bogus"], 2),
    ("plan", "no changes", [*PLAN, "{applied}"], 0),
    ("plan", "changes", [*PLAN, "{fresh}"], 0),
    ("plan", "problems", ["plan", "{broken}", "--db", "{db}"], 1),
    ("plan", "conflict", [*PLAN, "{clash}"], 1),
    ("plan", "adoptable conflict", [*PLAN, "{same_id}"], 1),
    ("plan --adopt", "adoptable conflict", [*PLAN, "{same_id}", "--adopt"], 0),
    ("plan", "unreachable database", ["plan", "{repo}", "--db", UNREACHABLE], 1),
    ("plan", "bad usage", [*PLAN, "{fresh}", "--format", "yaml"], 2),
    ("plan --detailed-exitcode", "no changes", [*PLAN, "{applied}", "--detailed-exitcode"], 0),
    ("plan --detailed-exitcode", "changes", [*PLAN, "{fresh}", "--detailed-exitcode"], 2),
    ("plan --detailed-exitcode", "problems",
     ["plan", "{broken}", "--db", "{db}", "--detailed-exitcode"], 1),
    ("plan --detailed-exitcode", "conflict", [*PLAN, "{clash}", "--detailed-exitcode"], 1),
    ("diff", "no changes", [*DIFF, "{head}", "{head}"], 0),
    ("diff", "changes", [*DIFF, "{base}", "{head}"], 0),
    ("diff", "problems", [*DIFF, "{head}", "{bad}"], 1),
    ("diff", "unknown revision", [*DIFF, "nope", "{head}"], 1),
    ("diff", "bad usage", [*DIFF, "{base}"], 2),
    ("diff --detailed-exitcode", "no changes", [*DIFF, "{head}", "{head}", "--detailed-exitcode"],
     0),
    ("diff --detailed-exitcode", "changes", [*DIFF, "{base}", "{head}", "--detailed-exitcode"], 2),
    ("diff --detailed-exitcode", "problems", [*DIFF, "{head}", "{bad}", "--detailed-exitcode"], 1),
    ("apply", "changes applied", [*APPLY, "{fresh}", "{repo}"], 0),
    ("apply", "nothing to change", [*APPLY, "{applied}", "{repo}"], 0),
    ("apply", "problems", [*APPLY, "{fresh}", "{broken}"], 1),
    ("apply", "conflict", [*APPLY, "{clash}", "{repo}"], 1),
    ("apply", "adoptable conflict", [*APPLY, "{same_id}", "{repo}"], 1),
    ("apply --adopt", "adoptable conflict", [*APPLY, "{same_id}", "{repo}", "--adopt"], 0),
    ("apply", "unreachable database", ["apply", "{repo}", "--db", UNREACHABLE], 1),
    ("apply", "bad usage", ["apply", "--db", "{db}"], 2),
    ("watch --once", "applied", [*WATCH, "{fresh}", "{repo}"], 0),
    ("watch --once", "nothing to change", [*WATCH, "{applied}", "{repo}"], 0),
    ("watch --once", "problems", [*WATCH, "{fresh}", "{broken}"], 1),
    ("watch --once", "missing folder", [*WATCH, "{fresh}", "{missing}"], 2),
    ("keys create", "created", [*KEYS, "--scopes", "admin", "--db", "{db}"], 0),
    ("keys create", "unusable database", [*KEYS, "--scopes", "admin", "--db", UNUSABLE], 1),
    ("keys create", "bad usage", [*KEYS, "--scopes", "root", "--db", "{db}"], 2),
    ("db upgrade", "up to date", ["db", "upgrade", "--db", "{db}"], 0),
    ("db upgrade", "unusable database", ["db", "upgrade", "--db", UNUSABLE], 1),
    ("db upgrade", "bad usage", ["db", "upgrade", "--bogus"], 2),
]  # fmt: skip


def _files(contents: dict[str, str]) -> list[SourceFile]:
    return [SourceFile(p, textwrap.dedent(t).lstrip("\n").encode()) for p, t in contents.items()]


@dataclass(frozen=True)
class World:
    """Folders, a git repository and a workspace where REPO is applied, shared by the table;
    :meth:`values` adds workspaces of the row's own."""

    root: Path
    database_url: str
    revisions: dict[str, str]
    applied: str

    def values(self) -> dict[str, str]:
        fresh, clash, same_id = (f"exit-{secrets.token_hex(5)}" for _ in range(3))
        self._unmanaged_agent(clash, None)  # the repository's agent's name, another id
        self._unmanaged_agent(same_id, load_repo(_files(REPO), same_id).agents["finance-agent"].id)
        folders = {name: str(self.root / name) for name in ("repo", "broken", "failing")}
        return {
            **folders,
            **self.revisions,
            "missing": str(self.root / "missing"),
            "git": str(self.root / "git"),
            "db": self.database_url,
            "applied": self.applied,
            "fresh": fresh,
            "clash": clash,
            "same_id": same_id,
        }

    def _unmanaged_agent(self, workspace: str, agent_id: str | None) -> None:
        db = Database(Settings(database_url=self.database_url))
        with db.transaction(write=True) as session:
            workspace_id = ensure_workspace(session, workspace, utc_now())
            body = {"name": "finance-agent", "id": agent_id}
            agent_store.create_agent(session, workspace_id, body, utc_now())
        db.dispose()


def _commit(work: git.Repo, folder: Path, contents: dict[str, str], message: str) -> str:
    write_files(folder, {name: None for name in REPO})
    write_files(folder, contents)
    work.git.add(A=True)
    return work.index.commit(message).hexsha


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, database_url: str) -> World:
    root = tmp_path_factory.mktemp("exit-codes")
    for name, contents in (("repo", REPO), ("broken", BROKEN), ("failing", FAILING)):
        write_files(root / name, contents)
    work = git.Repo.init(root / "git")
    folder = root / "git" / "policies"
    revisions = {
        "base": _commit(work, folder, REPO, "base"),
        "head": _commit(work, folder, CHANGED, "head"),
        "bad": _commit(work, folder, BROKEN, "broken"),
    }
    applied = f"exit-{secrets.token_hex(5)}"
    arguments = ["apply", str(root / "repo"), "--workspace", applied, "--db", database_url]
    assert CliRunner().invoke(main, arguments).exit_code == 0
    return World(root, database_url, revisions, applied)


@pytest.mark.parametrize(
    ("verb", "situation", "arguments", "code"),
    TABLE,
    ids=[f"{verb}: {situation}" for verb, situation, _, _ in TABLE],
)
def test_exit_code(
    world: World, tmp_path: Path, verb: str, situation: str, arguments: list[str], code: int
) -> None:
    values = world.values()
    env = {"AGENTAUTH_CACHE_DIR": str(tmp_path / "cache"), "NO_COLOR": "1"}
    args = [a.format(**values) for a in arguments]
    result = CliRunner().invoke(main, args, env=env, catch_exceptions=False)
    assert result.exit_code == code, result.output
