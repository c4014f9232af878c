"""The live side of a plan: :func:`read_live` reads the workspace's agents and policies as the
database holds them, with what the controller last wrote to each managed one and the last
apply's inventory (for ``controller.apply`` and the plan verb); :func:`as_applied` stands a
repository in for the database (the base revision of the diff verb).

Every read is of one workspace. The one question asked about the others is which of the ids a
repository declares they hold already (ids are unique across workspaces, and anyone can compute
or copy another workspace's): the answer is those ids and nothing of the objects behind them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from controller.plan import LiveObject, LiveState, agent_fields, policy_fields
from controller.repo import Repo
from core.store.models import Agent, Policy, SyncStatus

MANAGER = "git"
_CHUNK = 500  # ids per IN (...) list


def read_live(session: Session, workspace_id: str, repo: Repo | None = None) -> LiveState:
    """The workspace's state; with ``repo``, also which of the ids it declares belong to
    objects of another workspace (plan refuses those, apply too)."""
    agents = session.scalars(select(Agent).where(Agent.workspace_id == workspace_id)).all()
    names = {agent.id: agent.name for agent in agents}
    policies = session.scalars(select(Policy).where(Policy.workspace_id == workspace_id)).all()
    status = session.get(SyncStatus, workspace_id)
    inventory = frozenset(status.inventory or ()) if status is not None else frozenset()
    elsewhere: frozenset[str] = frozenset()
    if repo is not None:
        agent_ids = [a.id for a in repo.agents.values()]
        policy_ids = [p.id for p in repo.policies.values()]
        elsewhere = _held_elsewhere(session, workspace_id, Agent, agent_ids)
        elsewhere |= _held_elsewhere(session, workspace_id, Policy, policy_ids)
    return LiveState(
        tuple(_agent(agent) for agent in agents),
        tuple(_policy(policy, names.get(policy.agent_id, "")) for policy in policies),
        inventory,
        elsewhere,
    )


def _held_elsewhere(
    session: Session, workspace_id: str, model: type[Agent] | type[Policy], ids: Iterable[str]
) -> frozenset[str]:
    """Those of ``ids`` that are ids of ``model`` rows of another workspace (only the ids)."""
    wanted = sorted(set(ids))
    found: set[str] = set()
    for start in range(0, len(wanted), _CHUNK):
        query = select(model.id).where(
            model.id.in_(wanted[start : start + _CHUNK]), model.workspace_id != workspace_id
        )
        found.update(session.scalars(query))
    return frozenset(found)


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
        "mode": policy.mode,
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
