"""``/v1/agents``: create, list, read, update (status included), delete; an agent's usage of
its rate limits and budgets."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response
from sqlalchemy.orm import Session

from api.auth import requires, takes_query
from api.context import now, principal, services
from api.params import path_id, read_body, read_paging, read_query
from core.domain.validation import require_session_id
from core.hotpath.usage import usage as usage_of
from core.store import agents, audit, paced
from core.store.keys import Scope

bp = Blueprint("agents", __name__, url_prefix="/v1/agents")


@bp.post("")
@requires(Scope.ADMIN)
def create() -> tuple[dict[str, Any], int]:
    body = read_body("agent.json#/$defs/create")
    with services().db.transaction(write=True) as session:
        agent = agents.create_agent(session, principal().workspace_id, body, now())
        return agents.serialize_agent(agent), 201


@bp.get("")
@takes_query("limit", "offset")
def list_() -> dict[str, Any]:
    limit, offset = read_paging(read_query(), max_limit=200)
    with services().db.transaction() as session:
        page = agents.list_agents(session, principal().workspace_id, limit, offset)
        return page.envelope(agents.serialize_agent)


@bp.get("/<agent_id>")
def get(agent_id: str) -> dict[str, Any]:
    with services().db.transaction() as session:
        agent = agents.get_agent(session, principal().workspace_id, path_id(agent_id))
        return agents.serialize_agent(agent)


@bp.get("/<agent_id>/usage")
@takes_query("session_id")
def usage(agent_id: str) -> dict[str, Any]:
    """What each rate_limit and budget rule of the agent holds in its current window (any
    scope: an operator watching spend needs no key that can change anything)."""
    wanted = path_id(agent_id)
    session_id = read_query().get("session_id")
    if session_id is not None:
        require_session_id(session_id)
    with services().db.transaction() as session:
        found = usage_of(session, principal().workspace_id, wanted, now(), session_id)
    return {"data": found}


@bp.patch("/<agent_id>")
@requires(Scope.ADMIN)
def update(agent_id: str) -> dict[str, Any]:
    wanted = path_id(agent_id)
    body = read_body("agent.json#/$defs/update")
    with services().db.transaction(write=True) as session:
        agent = agents.update_agent(session, principal().workspace_id, wanted, body, now())
        return agents.serialize_agent(agent)


@bp.delete("/<agent_id>")
@requires(Scope.ADMIN)
def delete(agent_id: str) -> Response:
    wanted = path_id(agent_id)
    workspace_id = principal().workspace_id

    def batch(session: Session, size: int) -> int:
        agents.get_agent(session, workspace_id, wanted)  # 404 once another request deleted it
        return audit.erase(session, workspace_id, wanted, size)

    # its entries erased in paced batches first: other agents' decisions wait for one short
    # batch at most, not for the whole of a long log (a stop midway leaves the agent, some of
    # its entries erased: deleting it again goes on)
    # (each batch aimed at 10 ms of SQLite's write lock, since someone waits for the answer:
    # an agent of 20,000 entries among a million took 2.3 s, no decision waiting more than 34
    # ms; 11 s with the prune's 2.5 ms)
    paced.Pace(services().db, hold=paced.LONGER_HOLD_SECONDS).run(batch)
    with services().db.transaction(write=True) as session:
        agents.delete_agent(session, workspace_id, wanted)
    return Response(status=204)
