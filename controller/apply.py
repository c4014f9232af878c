"""Apply: execute a plan in one write transaction, all or nothing, and record what was applied.

The plan is computed inside the transaction that applies it (SQLite's write lock, or a
PostgreSQL advisory lock per workspace), so the base state cannot move between plan and apply.
Only objects the repository manages are touched, exactly as the plan says: a policy whose
agent changes moves in place (its id and rate-limit counters are kept). Whatever happens, the
attempt is recorded in ``sync_status``; a failed attempt leaves the last applied revision in
force.

Called by the ``apply``, ``watch`` and ``sync`` verbs and by ``serve --repo``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from controller.plan import Action, Change, Plan, build_plan, same
from controller.repo import Repo
from controller.state import MANAGER, read_live
from core.domain.errors import AgentAuthError, StorageError
from core.store import agents as agent_store
from core.store import policies as policy_store
from core.store.database import Database
from core.store.keys import ensure_workspace
from core.store.models import Policy, SyncStatus
from schemas import Problem

log = logging.getLogger("agentauth.controller")


class ApplyRefused(AgentAuthError):
    """The repository cannot be applied as it is (conflicts); nothing was written."""

    code = "APPLY_REFUSED"


@dataclass(frozen=True)
class ApplyResult:
    revision: str
    plan: Plan | None
    error: str | None = None
    problems: tuple[Problem, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return self.error is None


def apply_repo(
    db: Database,
    repo: Repo,
    *,
    workspace: str,
    revision: str,
    source: str,
    now: datetime,
    prune_agents: bool = False,
    adopt: bool = False,
    after_change: Callable[[Change], None] | None = None,
) -> ApplyResult:
    """Make the workspace what ``repo`` declares. ``after_change`` runs after each change,
    inside the transaction (tests use it to fail mid-apply)."""
    if repo.errors:
        error = f"the repository has {len(repo.errors)} problem(s); nothing was applied"
        _record_failure(db, workspace, source, revision, now, error, repo.errors)
        return ApplyResult(revision, None, error, tuple(repo.errors))
    if not repo.agents:
        # almost always a wrong folder or --path; applying it would prune every managed policy
        error = "the repository declares no agents; refusing to apply it (nothing was changed)"
        _record_failure(db, workspace, source, revision, now, error, ())
        return ApplyResult(revision, None, error)
    try:
        with db.transaction(write=True) as session:
            workspace_id = ensure_workspace(session, workspace, now)
            _lock_workspace(session, workspace_id)
            live = read_live(session, workspace_id, repo)
            plan = build_plan(repo, live, prune_agents=prune_agents, adopt=adopt)
            _refuse_conflicts(plan)
            for change in plan.changes:
                _execute(session, workspace_id, change, now)
                if after_change is not None:
                    after_change(change)
            _record_success(session, workspace_id, repo, plan, source, revision, now)
    except AgentAuthError as exc:
        _record_failure(db, workspace, source, revision, now, exc.message, ())
        return ApplyResult(revision, None, exc.message)
    return ApplyResult(revision, plan)


def _lock_workspace(session: Session, workspace_id: str) -> None:
    """One apply at a time per workspace (SQLite's write transaction already is one)."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(
            text("SELECT pg_advisory_xact_lock(hashtext(:key))"), {"key": f"apply:{workspace_id}"}
        )


def _refuse_conflicts(plan: Plan) -> None:
    """Conflicts left in the plan (with ``adopt``, adoptable ones are planned as updates)."""
    blocking = plan.of(Action.CONFLICT)
    if blocking:
        lines = "; ".join(f"{c.kind} '{c.name}': {c.note}" for c in blocking)
        raise ApplyRefused(f"{len(blocking)} conflict(s), nothing was applied: {lines}")


def _execute(session: Session, workspace_id: str, change: Change, now: datetime) -> None:
    if change.kind == "Agent":
        _execute_agent(session, workspace_id, change, now)
    else:
        _execute_policy(session, workspace_id, change, now)


def _execute_agent(session: Session, workspace_id: str, change: Change, now: datetime) -> None:
    wanted = dict(change.after or {})
    if change.action is Action.CREATE:
        body = {"id": change.id, "managed_by": MANAGER, **wanted}
        agent = agent_store.create_agent(session, workspace_id, body, now)
    elif change.action is Action.UPDATE:  # an adopted agent too: it becomes managed here
        agent = agent_store.update_agent(session, workspace_id, change.id, wanted, now)
        agent.managed_by = MANAGER
    elif change.action is Action.DELETE:
        agent_store.delete_agent(session, workspace_id, change.id)
        return
    else:
        return  # orphans are kept
    agent.managed_spec = wanted
    session.flush()


def _execute_policy(session: Session, workspace_id: str, change: Change, now: datetime) -> None:
    wanted = dict(change.after or {})
    if change.action is Action.CREATE:
        body = _policy_body(wanted) | {"id": change.id, "managed_by": MANAGER}
        policy = policy_store.create_policy(session, workspace_id, body, now)
    elif change.action is Action.UPDATE:
        policy = _update_policy(session, workspace_id, change, wanted, now)
    elif change.action is Action.DELETE:
        policy_store.delete_policy(session, workspace_id, change.id)
        return
    else:
        return
    policy.managed_spec = wanted
    session.flush()


def _update_policy(
    session: Session, workspace_id: str, change: Change, wanted: dict[str, Any], now: datetime
) -> Policy:
    """The policy made what ``wanted`` says, in place (an adopted one too: it becomes managed)."""
    body = _policy_body(wanted) | {"managed_by": MANAGER}
    agent_id = body.pop("agent_id")
    if same((change.before or {}).get("rules"), wanted["rules"]):
        body.pop("rules")  # replacing rules resets their rate-limit counters: only on change
    policy_store.update_policy(session, workspace_id, change.id, body, now)
    return policy_store.move_policy(session, workspace_id, change.id, agent_id, now)


def _policy_body(wanted: dict[str, Any]) -> dict[str, Any]:
    return {
        "agent_id": wanted["agent_id"],
        "name": wanted["name"],
        "rules": wanted["rules"],
        "priority": wanted["priority"],
        "enabled": wanted["enabled"],
        "mode": wanted["mode"],
    }


def _record_success(
    session: Session,
    workspace_id: str,
    repo: Repo,
    plan: Plan,
    source: str,
    revision: str,
    now: datetime,
) -> None:
    status = session.get(SyncStatus, workspace_id) or SyncStatus(workspace_id=workspace_id)
    status.source = source
    status.attempted_revision = revision
    status.attempted_at = now
    status.result = "applied" if plan.has_changes else "unchanged"
    status.error = None
    status.changes = plan.summary()
    status.inventory = sorted(
        [a.id for a in repo.agents.values()]
        + [p.id for p in repo.policies.values()]
        + [c.id for c in plan.of(Action.ORPHAN)]
    )
    status.applied_revision = revision
    status.applied_at = now
    session.add(status)


def _record_failure(
    db: Database,
    workspace: str,
    source: str,
    revision: str,
    now: datetime,
    error: str,
    problems: list[Problem] | tuple[Problem, ...],
) -> None:
    detail = error
    if problems:
        detail += "\n" + "\n".join(str(p) for p in problems[:50])
    try:
        _write_failure(db, workspace, source, revision, now, detail)
    except StorageError as exc:  # the database itself is down: the caller reports the error
        log.warning("could not record the failed apply of %s: %s", revision, exc.message)


def _write_failure(
    db: Database, workspace: str, source: str, revision: str, now: datetime, detail: str
) -> None:
    with db.transaction(write=True) as session:
        workspace_id = ensure_workspace(session, workspace, now)
        status = session.get(SyncStatus, workspace_id) or SyncStatus(workspace_id=workspace_id)
        status.source = source
        status.attempted_revision = revision
        status.attempted_at = now
        status.result = "failed"
        status.error = detail
        status.changes = None
        session.add(status)
