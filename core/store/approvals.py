"""Reading approvals (decisions §6): one by id, a filtered page, and the Approval object the API
and the webhooks show. Approvals are written only inside decision transactions
(``core.hotpath.approvals``): created or reused by calls, used by the one call they allow,
decided by a human. Called by ``api/approvals.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Select, and_, func, or_, select
from sqlalchemy.orm import Session

from core.domain.approvals import EXPIRING, ApprovalStatus, effective_status
from core.domain.clock import isoformat
from core.domain.errors import ApprovalNotFound
from core.store.models import Approval
from core.store.paging import Page, paginate


@dataclass(frozen=True)
class Filters:
    """The list's filters; None means "any". ``status`` is as approvals read, expiry included."""

    status: ApprovalStatus | None = None
    agent_id: str | None = None
    tool_name: str | None = None


def _reads_as(status: ApprovalStatus, now: datetime) -> ColumnElement[bool]:
    expiring = [s.value for s in EXPIRING]
    if status is ApprovalStatus.EXPIRED:
        return or_(
            Approval.status == status.value,
            and_(Approval.status.in_(expiring), Approval.expires_at <= now),
        )
    if status in EXPIRING:
        return and_(Approval.status == status.value, Approval.expires_at > now)
    return Approval.status == status.value


def _select(workspace_id: str, filters: Filters, now: datetime) -> Select[Any]:
    query = select(Approval).where(Approval.workspace_id == workspace_id)
    if filters.status is not None:
        query = query.where(_reads_as(filters.status, now))
    if filters.agent_id is not None:
        query = query.where(Approval.agent_id == filters.agent_id)
    if filters.tool_name is not None:
        query = query.where(Approval.tool_name == filters.tool_name)
    return query.order_by(Approval.created_at.desc(), Approval.id.desc())


def query(
    session: Session,
    workspace_id: str,
    filters: Filters,
    now: datetime,
    limit: int,
    offset: int,
) -> Page[Approval]:
    """One page, newest first; ties broken by id, so pages never overlap or skip."""
    return paginate(session, _select(workspace_id, filters, now), limit, offset)


def get(session: Session, workspace_id: str, approval_id: str) -> Approval:
    found = session.get(Approval, approval_id)
    if found is None or found.workspace_id != workspace_id:
        raise ApprovalNotFound()
    return found


def pending_by_workspace(session: Session, now: datetime) -> list[tuple[str, int]]:
    """How many approvals wait for a human now, per workspace that has any."""
    query = (
        select(Approval.workspace_id, func.count())
        .where(_reads_as(ApprovalStatus.PENDING, now))
        .group_by(Approval.workspace_id)
    )
    return [(workspace, int(count)) for workspace, count in session.execute(query)]


def serialize(row: Any, now: datetime) -> dict[str, Any]:
    """The Approval object: an ORM row or a mapping of the table's columns."""

    def get(name: str) -> Any:
        return row.get(name) if isinstance(row, dict) else getattr(row, name)

    decided_by = None
    if get("decided_by_key_id") is not None:
        decided_by = {"keyId": get("decided_by_key_id"), "name": get("decided_by_name")}
    return {
        "id": get("id"),
        "agentId": get("agent_id"),
        "toolName": get("tool_name"),
        "parameters": get("parameters"),
        "parametersDigest": get("parameters_digest"),
        "policyId": get("policy_id"),
        "ruleIndex": get("rule_index"),
        "status": effective_status(get("status"), get("expires_at"), now).value,
        "createdAt": isoformat(get("created_at")),
        "expiresAt": isoformat(get("expires_at")),
        "decidedAt": _instant(get("decided_at")),
        "decidedBy": decided_by,
        "comment": get("comment"),
        "usedAt": _instant(get("used_at")),
        "requestedByKeyId": get("requested_by_key_id"),
    }


def _instant(moment: datetime | None) -> str | None:
    return None if moment is None else isoformat(moment)
