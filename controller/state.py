"""The live side of a plan: :func:`read_live` reads the workspace's agents and policies as the
database holds them, with what the controller last wrote to each managed one and the last
apply's inventory (for ``controller.apply`` and the plan verb); :func:`as_applied` stands a
repository in for the database (the base revision of the diff verb)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from controller.plan import LiveObject, LiveState, agent_fields, policy_fields
from controller.repo import Repo
from core.store.models import Agent, Policy, SyncStatus

MANAGER = "git"


def read_live(session: Session, workspace_id: str) -> LiveState:
    agents = session.scalars(select(Agent).where(Agent.workspace_id == workspace_id)).all()
    names = {agent.id: agent.name for agent in agents}
    policies = session.scalars(select(Policy).where(Policy.workspace_id == workspace_id)).all()
    status = session.get(SyncStatus, workspace_id)
    inventory = frozenset(status.inventory or ()) if status is not None else frozenset()
    return LiveState(
        tuple(_agent(agent) for agent in agents),
        tuple(_policy(policy, names.get(policy.agent_id, "")) for policy in policies),
        inventory,
    )


def _agent(agent: Agent) -> LiveObject:
    fields = {"name": agent.name, "description": agent.description, "status": agent.status}
    return LiveObject(
        "Agent", agent.id, agent.name, fields, agent.managed_by == MANAGER, agent.managed_spec
    )


def _policy(policy: Policy, agent_name: str) -> LiveObject:
    fields: dict[str, Any] = {
        "name": policy.name,
        "agent": agent_name,
        "agent_id": policy.agent_id,
        "rules": policy.rules,
        "priority": policy.priority,
        "enabled": policy.enabled,
    }
    return LiveObject(
        "Policy", policy.id, policy.name, fields, policy.managed_by == MANAGER, policy.managed_spec
    )


def as_applied(repo: Repo) -> LiveState:
    """A repository as the database would hold it right after applying it (for ``diff``:
    the base revision plays the live state)."""
    agents = [
        LiveObject("Agent", a.id, a.name, fields, True, fields)
        for a in repo.agents.values()
        for fields in [agent_fields(a)]
    ]
    policies = [
        LiveObject("Policy", p.id, p.name, fields, True, fields)
        for p in repo.policies.values()
        for fields in [policy_fields(p)]
    ]
    return LiveState(tuple(agents), tuple(policies), frozenset(o.id for o in agents + policies))
