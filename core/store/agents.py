"""Agents: create, read, update, delete within one workspace. Called by ``api/agents.py`` (and
the controller for git-managed agents). Bodies arrive already validated against
``schemas/agent.json``."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from core.domain import ids
from core.domain.clock import isoformat
from core.domain.errors import AgentNotFound
from core.domain.jsonvalues import same
from core.store import audit, limits
from core.store.models import Agent, Policy
from core.store.paging import Page, paginate


class AgentStatus(StrEnum):
    ACTIVE = "active"
    SUSPENDED = "suspended"
    REVOKED = "revoked"


def create_agent(session: Session, workspace_id: str, body: dict[str, Any], now: datetime) -> Agent:
    agent = Agent(
        id=body.get("id") or ids.new_id(),
        workspace_id=workspace_id,
        name=body["name"],
        description=body.get("description"),
        status=body.get("status", AgentStatus.ACTIVE.value),
        managed_by=body.get("managed_by"),
        policy_version=0,
        created_at=now,
        updated_at=now,
    )
    session.add(agent)
    session.flush()
    return agent


def list_agents(session: Session, workspace_id: str, limit: int, offset: int) -> Page[Agent]:
    query = (
        select(Agent).where(Agent.workspace_id == workspace_id).order_by(Agent.created_at, Agent.id)
    )
    return paginate(session, query, limit, offset)


def get_agent(session: Session, workspace_id: str, agent_id: str, *, lock: bool = False) -> Agent:
    """The agent, or AgentNotFound (also for another workspace's agent)."""
    query = select(Agent).where(Agent.id == agent_id, Agent.workspace_id == workspace_id)
    if lock:
        query = query.with_for_update()
    agent = session.scalars(query).first()
    if agent is None:
        raise AgentNotFound()
    return agent


def update_agent(
    session: Session, workspace_id: str, agent_id: str, body: dict[str, Any], now: datetime
) -> Agent:
    """Change only the supplied fields; ``description: null`` clears it. A field given the
    value it has is no change: an update that changes nothing writes nothing, ``updated_at``
    included."""
    agent = get_agent(session, workspace_id, agent_id, lock=True)
    changed = {
        field: body[field]
        for field in ("name", "description", "status")
        if field in body and not same(getattr(agent, field), body[field])
    }
    if not changed:
        return agent
    for field, value in changed.items():
        setattr(agent, field, value)
    agent.updated_at = now
    session.flush()
    return agent


def delete_agent(session: Session, workspace_id: str, agent_id: str) -> None:
    """Delete the agent; the database cascades to its policies, and its audit entries' content
    is erased (their places in the chain stay). The agent's row is locked first, so that no
    decision can chain a new entry of it between the erasure and the deletion."""
    agent = get_agent(session, workspace_id, agent_id)
    session.execute(select(Agent.id).where(Agent.id == agent.id).with_for_update())
    audit.erase(session, workspace_id, agent.id)
    policy_ids = session.scalars(
        select(Policy.id).where(Policy.workspace_id == workspace_id, Policy.agent_id == agent.id)
    ).all()
    for policy_id in policy_ids:
        limits.reset(session, policy_counter_prefix(policy_id))
    session.execute(delete(Agent).where(Agent.id == agent.id))


def bump_policy_version(agent: Agent) -> None:
    """Mark the agent's policies as changed, so every process recompiles them."""
    agent.policy_version += 1


def policy_counter_prefix(policy_id: str) -> str:
    return f"rule:{policy_id}:"


def serialize_agent(agent: Agent) -> dict[str, Any]:
    return {
        "id": agent.id,
        "name": agent.name,
        "description": agent.description,
        "status": agent.status,
        "managedBy": agent.managed_by,
        "createdAt": isoformat(agent.created_at),
        "updatedAt": isoformat(agent.updated_at),
    }
