"""``/v1/approvals`` (decisions §6): list and read the approvals escalated calls wait for (any
key), approve or deny one (``admin`` or ``approver``). Deciding runs in the group-commit
recorder, so the approval, its audit entry and its webhook event commit together."""

from __future__ import annotations

from typing import Any

from flask import Blueprint

from api.auth import requires, takes_query
from api.context import now, principal, services
from api.params import path_id, read_body, read_paging, read_query
from core.domain.approvals import ApprovalStatus
from core.domain.errors import ValidationError
from core.domain.validation import require_uuid
from core.hotpath import approvals as deciding
from core.hotpath.recorder import Batch
from core.store import approvals
from core.store.keys import Scope

bp = Blueprint("approvals", __name__, url_prefix="/v1/approvals")
STATUSES = tuple(status.value for status in ApprovalStatus)


def _filters(query: dict[str, str]) -> approvals.Filters:
    status = query.get("status")
    if status is not None and status not in STATUSES:
        raise ValidationError.field("status", "must be one of: " + ", ".join(STATUSES))
    agent_id = query.get("agent_id")
    return approvals.Filters(
        status=None if status is None else ApprovalStatus(status),
        agent_id=None if agent_id is None else require_uuid(agent_id, "agent_id"),
        tool_name=query.get("tool_name"),
    )


@bp.get("")
@takes_query("status", "agent_id", "tool_name", "limit", "offset")
def list_() -> dict[str, Any]:
    query = read_query()
    filters = _filters(query)
    limit, offset = read_paging(query, max_limit=200)
    moment = now()
    with services().db.transaction() as session:
        page = approvals.query(session, principal().workspace_id, filters, moment, limit, offset)
        return page.envelope(lambda row: approvals.serialize(row, moment))


@bp.get("/<approval_id>")
def get(approval_id: str) -> dict[str, Any]:
    wanted = path_id(approval_id)
    with services().db.transaction() as session:
        found = approvals.get(session, principal().workspace_id, wanted)
        return approvals.serialize(found, now())


@bp.post("/<approval_id>/approve")
@requires(Scope.APPROVER)
def approve(approval_id: str) -> dict[str, Any]:
    return _decide(approval_id, approve=True)


@bp.post("/<approval_id>/deny")
@requires(Scope.APPROVER)
def deny(approval_id: str) -> dict[str, Any]:
    return _decide(approval_id, approve=False)


def _decide(approval_id: str, *, approve: bool) -> dict[str, Any]:
    wanted = path_id(approval_id)
    # the body is optional: none at all is no comment
    body = read_body("approval.json#/$defs/decide", optional=True)
    caller, moment, recorder = principal(), now(), services().recorder

    def job(batch: Batch) -> dict[str, Any]:
        return deciding.decide(
            batch,
            recorder.statements.approvals,
            workspace_id=caller.workspace_id,
            approval_id=wanted,
            approve=approve,
            key_id=caller.key_id,
            comment=body.get("comment"),
            now=moment,
        )

    return recorder.run(job)
