"""Approvals inside the decision's transaction (decisions §6): the engine's
:class:`core.domain.approvals.CallApprovals` over a group-commit batch, and the webhook events
an approval raises, stored in the same transaction (the outbox the delivery worker reads).

Single use holds across processes and hosts: :meth:`BatchApprovals.use` is one conditional
UPDATE (``status = 'approved'``), so of two transactions using one approval the second finds
nothing to update (SQLite serialises writers; PostgreSQL makes the second wait for the first
and then re-check the row). One pending approval per call: a partial unique index, and an
``INSERT ... ON CONFLICT DO NOTHING`` that leaves the other process's row to be read instead.
Called by ``core.hotpath.decisions`` (calls) and ``api/approvals.py`` (approve, deny). One
module, over 300 lines, because its statements, the call's view of its approvals and a human's
decision share one promise about the approvals table (what "pending" and "used" mean under
concurrency), which would be harder to keep true split in three.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, bindparam, insert, literal, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect

from core.domain import ids
from core.domain.approvals import ApprovalStatus, FoundApproval, effective_status, governing
from core.domain.clock import isoformat
from core.domain.errors import ApprovalNotFound, ApprovalNotPending, SelfApprovalForbidden
from core.domain.redaction import scrub
from core.hotpath.sql import compile_for
from core.store import approvals, audit
from core.store.models import (
    ApiKey,
    Approval,
    ApprovalRequester,
    Webhook,
    WebhookDelivery,
    WebhookEvent,
)

_A = Approval.__table__.c
_SAME_CALL = and_(
    _A.workspace_id == bindparam("workspace_id"),
    _A.agent_id == bindparam("agent_id"),
    _A.tool_name == bindparam("tool_name"),
    _A.parameters_digest == bindparam("digest"),
)
_CURRENT = select(_A.id, _A.status, _A.expires_at, _A.created_at).where(
    _SAME_CALL,
    _A.status != ApprovalStatus.USED.value,
    _A.status != ApprovalStatus.EXPIRED.value,
    _A.expires_at > bindparam("now", type_=_A.expires_at.type),
)
_USE = update(Approval).where(
    _A.id == bindparam("approval_id"),
    _A.status == ApprovalStatus.APPROVED.value,
    _A.expires_at > bindparam("now", type_=_A.expires_at.type),
)
_RESTORE = update(Approval).where(_A.id == bindparam("approval_id"))
# a pending approval past its expiry gives way to a new one (it reads as expired already)
_EXPIRE_STALE = update(Approval).where(
    _SAME_CALL,
    _A.status == ApprovalStatus.PENDING.value,
    _A.expires_at <= bindparam("now", type_=_A.expires_at.type),
)
_APPROVAL_COLUMNS = (
    "id", "workspace_id", "agent_id", "tool_name", "parameters", "parameters_digest",
    "policy_id", "rule_index", "status", "created_at", "expires_at", "requested_by_key_id",
)  # fmt: skip
_PENDING = select(_A.id, _A.expires_at).where(_SAME_CALL, _A.status == ApprovalStatus.PENDING.value)
_BY_ID = select(*Approval.__table__.c).where(
    _A.id == bindparam("approval_id"), _A.workspace_id == bindparam("workspace_id")
)
_ASKED = select(ApprovalRequester.key_id).where(
    ApprovalRequester.approval_id == bindparam("approval_id"),
    ApprovalRequester.key_id == bindparam("key_id"),
)
_KEY_NAME = select(ApiKey.name).where(ApiKey.id == bindparam("key_id"))
_DECIDE = (
    update(Approval)
    .where(
        _A.id == bindparam("approval_id"),
        _A.status == ApprovalStatus.PENDING.value,
        _A.expires_at > bindparam("now", type_=_A.expires_at.type),
    )
    .values(
        status=bindparam("status"),
        decided_at=bindparam("decided_at", type_=_A.decided_at.type),
        decided_by_key_id=bindparam("decided_by_key_id"),
        decided_by_name=bindparam("decided_by_name"),
        comment=bindparam("comment"),
    )
)
_SUBSCRIBERS = select(Webhook.id).where(
    Webhook.workspace_id == bindparam("workspace_id"),
    Webhook.events.contains(bindparam("event_type")),  # event types hold no % or _
)
_EVENT = insert(WebhookEvent).values(
    {
        c: bindparam(c, type_=WebhookEvent.__table__.c[c].type)
        for c in WebhookEvent.__table__.c.keys()  # noqa: SIM118 (column names)
    }
)
_DELIVERY_COLUMNS = ("id", "webhook_id", "event_id", "event_type", "created_at", "next_attempt_at")
_DELIVERY = insert(WebhookDelivery).values(
    {
        **{c: bindparam(c, type_=WebhookDelivery.__table__.c[c].type) for c in _DELIVERY_COLUMNS},
        "attempt": literal(0),
        "status": literal("pending"),
    }
)


class ApprovalStatements:
    """The approval and outbox SQL in the driver's parameter style, once per dialect."""

    def __init__(self, dialect: Dialect) -> None:
        flavour = postgresql if dialect.name == "postgresql" else sqlite

        def typed(name: str) -> Any:
            return bindparam(name, type_=_A[name].type)

        create = (
            flavour.insert(Approval)
            .values({c: typed(c) for c in _APPROVAL_COLUMNS})
            .on_conflict_do_nothing()
            .returning(_A.id)
        )
        requester = flavour.insert(ApprovalRequester).values(
            approval_id=bindparam("approval_id"), key_id=bindparam("key_id")
        )
        self.current = compile_for(_CURRENT, dialect)
        self.use = compile_for(
            _USE.values(
                status=ApprovalStatus.USED.value,
                used_at=bindparam("used_at", type_=_A.used_at.type),
            ),
            dialect,
        )
        self.restore = compile_for(
            _RESTORE.values(status=ApprovalStatus.APPROVED.value, used_at=None), dialect
        )
        self.expire_stale = compile_for(
            _EXPIRE_STALE.values(status=ApprovalStatus.EXPIRED.value), dialect
        )
        self.create = compile_for(create, dialect)
        self.pending = compile_for(_PENDING, dialect)
        self.requester = compile_for(requester.on_conflict_do_nothing(), dialect)
        self.by_id = compile_for(_BY_ID, dialect)
        self.asked = compile_for(_ASKED, dialect)
        self.key_name = compile_for(_KEY_NAME, dialect)
        self.decide = compile_for(_DECIDE, dialect)
        self.subscribers = compile_for(_SUBSCRIBERS, dialect)
        self.event = compile_for(_EVENT, dialect)
        self.delivery = compile_for(_DELIVERY, dialect)
        self._columns = [
            (column.name, column.type.dialect_impl(dialect).result_processor(dialect, None))
            for column in Approval.__table__.c
        ]
        process = _A.expires_at.type.dialect_impl(dialect).result_processor(dialect, None)
        self.timestamp: Callable[[Any], Any] = process or (lambda value: value)

    def approval(self, values: Any) -> dict[str, Any]:
        """A row of :data:`_BY_ID` as Python values, by column name."""
        return {
            name: value if process is None else process(value)
            for (name, process), value in zip(self._columns, values, strict=True)
        }


class BatchApprovals:
    """One call's approvals (its workspace, agent, tool name and parameters digest) in the
    batch that records its decision: the engine's ``CallApprovals``."""

    def __init__(
        self,
        batch: Any,
        sql: ApprovalStatements,
        *,
        workspace_id: str,
        agent_id: str,
        tool_name: str,
        digest: str,
        redacted: Any,
        key_id: str | None,
    ) -> None:
        self._batch, self._sql = batch, sql
        self._call = {
            "workspace_id": workspace_id,
            "agent_id": agent_id,
            "tool_name": tool_name,
            "digest": digest,
        }
        self._redacted, self._key_id = redacted, key_id
        self._pending: FoundApproval | None = None

    def current(self, now: datetime) -> FoundApproval | None:
        rows = self._batch.read(self._sql.current, {**self._call, "now": now})
        # the query takes unexpired rows only, so each reads as its stored status
        found = governing(
            FoundApproval(row[0], ApprovalStatus(row[1]), self._sql.timestamp(row[2]))
            for row in rows
        )
        if found is not None and found.status is ApprovalStatus.PENDING:
            self._pending = found
        return found

    def use(self, approval_id: str, now: datetime) -> bool:
        cursor = self._batch.execute(
            self._sql.use, {"approval_id": approval_id, "now": now, "used_at": now}
        )
        return bool(cursor.rowcount == 1)

    def restore(self, approval_id: str) -> None:
        self._batch.execute(self._sql.restore, {"approval_id": approval_id})

    def request(
        self, ttl_seconds: int, policy_id: str, rule_index: int, now: datetime
    ) -> FoundApproval:
        found = self._pending
        if found is None:
            found = self._create(ttl_seconds, policy_id, rule_index, now)
        if self._key_id is not None:
            self._batch.execute(
                self._sql.requester, {"approval_id": found.id, "key_id": self._key_id}
            )
        return found

    def _create(
        self, ttl_seconds: int, policy_id: str, rule_index: int, now: datetime
    ) -> FoundApproval:
        self._batch.execute(self._sql.expire_stale, {**self._call, "now": now})
        expires = now + timedelta(seconds=ttl_seconds)
        row = {
            "id": ids.new_sortable_id(),
            "workspace_id": self._call["workspace_id"],
            "agent_id": self._call["agent_id"],
            "tool_name": self._call["tool_name"],
            "parameters": self._redacted,
            "parameters_digest": self._call["digest"],
            "policy_id": policy_id,
            "rule_index": rule_index,
            "status": ApprovalStatus.PENDING.value,
            "created_at": now,
            "expires_at": expires,
            "requested_by_key_id": self._key_id,
        }
        if self._batch.execute(self._sql.create, row).fetchone() is None:
            # another process created it first (PostgreSQL): wait for no one, read theirs
            (other,) = self._batch.read(self._sql.pending, self._call)
            return FoundApproval(other[0], ApprovalStatus.PENDING, self._sql.timestamp(other[1]))
        data = approvals.serialize(row, now)
        enqueue(self._batch, self._sql, row["workspace_id"], "approval.requested", data, now)
        return FoundApproval(row["id"], ApprovalStatus.PENDING, expires)


def decide(
    batch: Any,
    sql: ApprovalStatements,
    *,
    workspace_id: str,
    approval_id: str,
    approve: bool,
    key_id: str,
    comment: str | None,
    now: datetime,
) -> dict[str, Any]:
    """A human's decision on a pending approval (decisions §6), in the batch's transaction: the
    approval, an audit entry (``approval.approve`` or ``approval.deny``) and the
    ``approval.decided`` event. Returns the Approval object. Raises ApprovalNotFound,
    SelfApprovalForbidden (a key that made a matching call) and ApprovalNotPending, before
    anything is written."""
    found = batch.read(sql.by_id, {"approval_id": approval_id, "workspace_id": workspace_id})
    if not found:
        raise ApprovalNotFound()
    row = sql.approval(found[0])
    asked = batch.read(sql.asked, {"approval_id": approval_id, "key_id": key_id})
    if asked or row["requested_by_key_id"] == key_id:
        raise SelfApprovalForbidden()
    if effective_status(row["status"], row["expires_at"], now) is not ApprovalStatus.PENDING:
        raise ApprovalNotPending()
    named = batch.read(sql.key_name, {"key_id": key_id})
    name = named[0][0] if named else key_id
    status = ApprovalStatus.APPROVED if approve else ApprovalStatus.DENIED
    decided = {
        "status": status.value,
        "decided_at": now,
        "decided_by_key_id": key_id,
        "decided_by_name": name,
        "comment": None if comment is None else scrub(comment),
    }
    changed = batch.execute(sql.decide, {"approval_id": approval_id, "now": now, **decided})
    if changed.rowcount != 1:  # decided by another process since it was read
        raise ApprovalNotPending()
    row.update(decided)
    data = approvals.serialize(row, now)
    verb = "approved" if approve else "denied"
    batch.append_audit(
        audit.entry(
            workspace_id=workspace_id,
            agent_id=row["agent_id"],
            agent_exists=True,
            key_id=key_id,
            tool_name=row["tool_name"],
            parameters=row["parameters"],
            result="allowed" if approve else "denied",
            policy_id=row["policy_id"],
            rule_index=row["rule_index"],
            reason=comment or f"{verb} by {name}",
            latency_ms=0.0,
            timestamp=now,
            approval_id=approval_id,
            action="approval.approve" if approve else "approval.deny",
        )
    )
    enqueue(batch, sql, workspace_id, "approval.decided", data, now)
    return data


def enqueue(
    batch: Any,
    sql: ApprovalStatements,
    workspace_id: str,
    event_type: str,
    data: dict[str, Any],
    now: datetime,
) -> None:
    """Store an event for every webhook of the workspace that subscribed to ``event_type``, in
    the batch's transaction; nothing when none did. The delivery worker sends it afterwards."""
    found = batch.read(sql.subscribers, {"workspace_id": workspace_id, "event_type": event_type})
    if not found:
        return
    event_id = ids.new_sortable_id()
    payload = {"id": event_id, "type": event_type, "createdAt": isoformat(now), "data": data}
    batch.execute(
        sql.event,
        {
            "id": event_id,
            "workspace_id": workspace_id,
            "type": event_type,
            "payload": payload,
            "created_at": now,
        },
    )
    for (webhook_id,) in found:
        batch.execute(
            sql.delivery,
            {
                "id": ids.new_sortable_id(),
                "webhook_id": webhook_id,
                "event_id": event_id,
                "event_type": event_type,
                "created_at": now,
                "next_attempt_at": now,
            },
        )
