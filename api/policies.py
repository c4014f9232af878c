"""``/v1/policies``: create, list (optionally by agent), read, update, delete, and a policy's
shadow report (decisions §10)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from flask import Blueprint, Response

from api.auth import requires, takes_query
from api.context import now, principal, services
from api.params import back_from, path_id, read_body, read_instant, read_paging, read_query
from core.domain.errors import ValidationError
from core.domain.validation import require_uuid
from core.store import policies, shadow
from core.store.keys import Scope

bp = Blueprint("policies", __name__, url_prefix="/v1/policies")


@bp.post("")
@requires(Scope.ADMIN)
def create() -> tuple[dict[str, Any], int]:
    body = read_body("policy.json#/$defs/create")
    with services().db.transaction(write=True) as session:
        policy = policies.create_policy(session, principal().workspace_id, body, now())
        return policies.serialize_policy(policy), 201


@bp.get("")
@takes_query("agent_id", "limit", "offset")
def list_() -> dict[str, Any]:
    query = read_query()
    limit, offset = read_paging(query, max_limit=200)
    agent_id = require_uuid(query["agent_id"], "agent_id") if "agent_id" in query else None
    with services().db.transaction() as session:
        page = policies.list_policies(session, principal().workspace_id, agent_id, limit, offset)
        return page.envelope(policies.serialize_policy)


@bp.get("/<policy_id>")
def get(policy_id: str) -> dict[str, Any]:
    with services().db.transaction() as session:
        policy = policies.get_policy(session, principal().workspace_id, path_id(policy_id))
        return policies.serialize_policy(policy)


@bp.patch("/<policy_id>")
@requires(Scope.ADMIN)
def update(policy_id: str) -> dict[str, Any]:
    wanted = path_id(policy_id)
    body = read_body("policy.json#/$defs/update")
    with services().db.transaction(write=True) as session:
        policy = policies.update_policy(session, principal().workspace_id, wanted, body, now())
        return policies.serialize_policy(policy)


@bp.delete("/<policy_id>")
@requires(Scope.ADMIN)
def delete(policy_id: str) -> Response:
    wanted = path_id(policy_id)
    with services().db.transaction(write=True) as session:
        policies.delete_policy(session, principal().workspace_id, wanted)
    return Response(status=204)


@bp.get("/<policy_id>/shadow-report")
@takes_query("from", "to")
def shadow_report(policy_id: str) -> dict[str, Any]:
    """What the policy's would-be decisions did over ``[from, to]`` (``to``: now; ``from``:
    7 days before ``to``), exactly, from the counts kept as entries were committed."""
    wanted = path_id(policy_id)
    query = read_query()
    until = read_instant(query, "to") or now()
    since = read_instant(query, "from") or back_from(until, timedelta(days=shadow.DEFAULT_DAYS))
    if since > until:
        raise ValidationError.field("from", "must not be after to")
    with services().db.transaction(snapshot=True) as session:
        found = shadow.report(session, principal().workspace_id, wanted, since, until)
    return found.as_json()
