"""Policies: create, read, update, delete within one workspace. Called by ``api/policies.py``
and the controller. Every change bumps the owning agent's ``policy_version`` in the same
transaction, which is how compiled-policy caches in every process learn of it; replacing a
policy's rules with different ones resets its rate-limit counters, and so does changing its
mode (a policy starts with empty counters in its new mode: decisions §10). An update that changes
nothing (every field it gives already has that value, as JSON) is no change."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.domain import ids
from core.domain.clock import isoformat
from core.domain.errors import PolicyNotFound
from core.domain.jsonvalues import same
from core.store import limits
from core.store.agents import bump_policy_version, get_agent, policy_counter_prefix
from core.store.models import Policy
from core.store.paging import Page, paginate


def create_policy(
    session: Session, workspace_id: str, body: dict[str, Any], now: datetime
) -> Policy:
    agent = get_agent(session, workspace_id, ids.normalize_uuid(body["agent_id"]), lock=True)
    policy = Policy(
        id=body.get("id") or ids.new_id(),
        workspace_id=workspace_id,
        agent_id=agent.id,
        name=body["name"],
        rules=body["rules"],
        priority=int(body.get("priority", 0)),
        enabled=body.get("enabled", True),
        mode=body.get("mode", "enforce"),
        managed_by=body.get("managed_by"),
        created_at=now,
        updated_at=now,
    )
    session.add(policy)
    bump_policy_version(agent)
    session.flush()
    return policy


def list_policies(
    session: Session, workspace_id: str, agent_id: str | None, limit: int, offset: int
) -> Page[Policy]:
    query = select(Policy).where(Policy.workspace_id == workspace_id)
    if agent_id is not None:
        query = query.where(Policy.agent_id == agent_id)
    return paginate(session, query.order_by(Policy.created_at, Policy.id), limit, offset)


def get_policy(session: Session, workspace_id: str, policy_id: str) -> Policy:
    """The policy, or PolicyNotFound (also for another workspace's policy)."""
    policy = session.get(Policy, policy_id)
    if policy is None or policy.workspace_id != workspace_id:
        raise PolicyNotFound()
    return policy


#: what an update may change (the API never moves a policy; the controller does, by
#: :func:`move_policy`)
_UPDATABLE = ("name", "rules", "priority", "enabled", "mode", "managed_by")


def update_policy(
    session: Session, workspace_id: str, policy_id: str, body: dict[str, Any], now: datetime
) -> Policy:
    """Change only the supplied fields; ``rules`` replaces the whole list (and, like a new
    ``mode``, resets its rate-limit counters). A field given the value it has is no change,
    compared as JSON (rules written with ``1.0`` or in another key order are the same rules):
    an update that changes nothing writes nothing, ``updated_at`` and the counters
    included."""
    policy = get_policy(session, workspace_id, policy_id)
    changed = {
        field: body[field]
        for field in _UPDATABLE
        if field in body and not same(getattr(policy, field), body[field])
    }
    if not changed:
        return policy
    agent = get_agent(session, workspace_id, policy.agent_id, lock=True)
    if "rules" in changed or "mode" in changed:
        limits.reset(session, policy_counter_prefix(policy.id))
    if "priority" in changed:
        changed["priority"] = int(changed["priority"])
    for field, value in changed.items():
        setattr(policy, field, value)
    policy.updated_at = now
    bump_policy_version(agent)
    session.flush()
    return policy


def move_policy(
    session: Session, workspace_id: str, policy_id: str, agent_id: str, now: datetime
) -> Policy:
    """Put the policy on another agent of the workspace, in place: its id and rate-limit
    counters are kept (a delete and a create would reset them). Both agents' policy versions
    move, so every process recompiles both."""
    policy = get_policy(session, workspace_id, policy_id)
    if policy.agent_id == agent_id:
        return policy
    left = get_agent(session, workspace_id, policy.agent_id, lock=True)
    joined = get_agent(session, workspace_id, agent_id, lock=True)
    policy.agent_id = joined.id
    policy.updated_at = now
    bump_policy_version(left)
    bump_policy_version(joined)
    session.flush()
    return policy


def delete_policy(session: Session, workspace_id: str, policy_id: str) -> None:
    policy = get_policy(session, workspace_id, policy_id)
    agent = get_agent(session, workspace_id, policy.agent_id, lock=True)
    limits.reset(session, policy_counter_prefix(policy.id))
    session.delete(policy)
    bump_policy_version(agent)
    session.flush()


def serialize_policy(policy: Policy) -> dict[str, Any]:
    return {
        "id": policy.id,
        "agentId": policy.agent_id,
        "name": policy.name,
        "rules": policy.rules,
        "priority": policy.priority,
        "enabled": policy.enabled,
        "mode": policy.mode,
        "managedBy": policy.managed_by,
        "createdAt": isoformat(policy.created_at),
        "updatedAt": isoformat(policy.updated_at),
    }
