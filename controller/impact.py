"""Impact analysis for a plan: replay an agent's most recent recorded calls through the engine
with its live policies and with the planned ones, and count the decisions that would flip.

Both sides run on the same inputs, so what the audit log cannot reproduce cancels out:
parameters stored redacted are replayed redacted on both sides, and rate limits are treated
as not exhausted on both. Each call is replayed at the instant it was recorded (time windows
see the time it happened). Every read is of the repository's workspace only: an agent id of
another workspace (ids are computable, and ``metadata.id`` may name any) has no history here.
Called by the plan verb.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from controller.plan import Plan
from controller.repo import DesiredPolicy, Repo
from core.domain.approvals import MemoryApprovals
from core.domain.compiler import compile_policy
from core.domain.engine import (
    CompiledPolicy,
    Decision,
    evaluate,
    order_policies,
    settle,
)
from core.domain.limits import Charge, Refusal
from core.domain.modes import PolicySet
from core.hotpath.decisions import load_policies
from core.store.models import AuditEntry

DEFAULT_REPLAY = 10_000
EXAMPLES = 3


@dataclass(frozen=True)
class Call:
    tool: str
    parameters: dict[str, Any]
    at: datetime
    session_id: str | None = None


@dataclass(frozen=True)
class Flip:
    call: Call
    before: Decision
    after: Decision


@dataclass(frozen=True)
class AgentImpact:
    agent: str
    replayed: int
    to_denied: int
    to_allowed: int
    examples: tuple[Flip, ...]


def _never_exhausted(charges: Sequence[Charge], now: datetime) -> Refusal | None:
    return None


def _decide(policies: Sequence[CompiledPolicy], call: Call) -> Decision:
    """No approval was ever granted in a replay: a call that needs one is escalated (and so
    not allowed), on both sides alike."""
    evaluated = evaluate(policies, call.tool, call.parameters, call.at, call.session_id)
    approvals = MemoryApprovals().for_call(call.tool, call.parameters)
    return settle(evaluated, _never_exhausted, approvals)


def replay(
    agent: str,
    before: Sequence[CompiledPolicy],
    after: Sequence[CompiledPolicy],
    calls: Iterable[Call],
) -> AgentImpact:
    """Pure: the flips between two policy sets over ``calls``."""
    replayed = to_denied = to_allowed = 0
    examples: list[Flip] = []
    for call in calls:
        replayed += 1
        old = _decide(before, call)
        new = _decide(after, call)
        if old.allowed == new.allowed:
            continue
        if old.allowed:
            to_denied += 1
        else:
            to_allowed += 1
        if len(examples) < 2 * EXAMPLES:
            examples.append(Flip(call, old, new))
    return AgentImpact(agent, replayed, to_denied, to_allowed, tuple(examples))


def analyse(session: Session, repo: Repo, plan: Plan, limit: int) -> list[AgentImpact]:
    """For each existing agent whose policies the plan changes, its last ``limit`` calls."""
    if limit <= 0:
        return []
    touched = sorted(
        {c.agent for c in plan.changes if c.kind == "Policy" and c.agent is not None}
        & set(repo.agents)
    )
    workspace_id = repo.workspace_id
    with_history = _with_history(session, workspace_id, [repo.agents[n].id for n in touched])
    out = []
    for name in touched:
        agent = repo.agents[name]
        if agent.id not in with_history:
            continue
        calls = list(_recent_calls(session, workspace_id, agent.id, limit))
        if calls:  # compile nothing for an agent without history
            # what decides the calls: the enforced policies, on both sides (a warn or shadow
            # policy's evidence is its shadow report, shown beside the replay)
            before = PolicySet.of(_live_policies(session, workspace_id, agent.id)).enforced
            after = PolicySet.of(compile_desired(repo.policies_of(name))).enforced
            out.append(replay(name, before, after, calls))
    return out


def compile_desired(policies: Iterable[DesiredPolicy]) -> list[CompiledPolicy]:
    """The engine's view of a repository's policies. Policies not yet in any database have no
    creation time; they are ordered as one apply creates them: by priority, then id."""
    epoch = datetime.fromisoformat("2000-01-01T00:00:00+00:00")
    return order_policies(
        compile_policy(
            id=p.id,
            name=p.name,
            priority=p.priority,
            enabled=p.enabled,
            created_at=epoch,
            rules=p.rules,
            mode=p.mode,
        )
        for p in policies
    )


def _live_policies(session: Session, workspace_id: str, agent_id: str) -> list[CompiledPolicy]:
    """Exactly what the server would evaluate: the same loader as its policy cache."""
    return load_policies(session.connection(), workspace_id, agent_id)


def _with_history(session: Session, workspace_id: str, agent_ids: list[str]) -> set[str]:
    """The workspace's agents among ``agent_ids`` with at least one recorded call (one query
    per 500)."""
    found: set[str] = set()
    for start in range(0, len(agent_ids), 500):
        chunk = agent_ids[start : start + 500]
        query = (
            select(AuditEntry.agent_id)
            .where(
                AuditEntry.workspace_id == workspace_id,
                AuditEntry.agent_id.in_(chunk),
                AuditEntry.agent_ref.is_not(None),
            )
            .distinct()
        )
        found.update(str(row) for row in session.scalars(query))
    return found


def _recent_calls(session: Session, workspace_id: str, agent_id: str, limit: int) -> Iterable[Call]:
    query = (
        select(
            AuditEntry.tool_name,
            AuditEntry.parameters,
            AuditEntry.timestamp,
            AuditEntry.session_id,
        )
        .where(
            AuditEntry.workspace_id == workspace_id,
            AuditEntry.agent_id == agent_id,
            AuditEntry.agent_ref.is_not(None),
        )
        .order_by(AuditEntry.timestamp.desc(), AuditEntry.id.desc())
        .limit(limit)
    )
    for tool, parameters, at, session_id in session.execute(query):
        yield Call(tool, parameters if isinstance(parameters, dict) else {}, at, session_id)
