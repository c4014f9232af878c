"""Webhooks and their deliveries: create, list, delete, the delivery records, and the queries of
the delivery worker (``api.outbox``).

Events and their delivery rows are written by ``core.hotpath.approvals.enqueue``, in the
transaction of what caused them. The worker then takes due deliveries with a lease: one
conditional UPDATE moves ``next_attempt_at`` past the try's longest duration, so of several
workers (processes, hosts) polling one database exactly one takes each row (SQLite serialises
writers; PostgreSQL makes the second UPDATE wait for the first and then re-check the row, which
no longer qualifies). A worker killed mid-try leaves the lease to expire, and the delivery is
tried again: at least once. Called by ``api.webhooks`` and ``api.outbox``; transactions are the
caller's.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from core.domain import ids
from core.domain.clock import isoformat
from core.domain.errors import WebhookNotFound
from core.domain.webhooks import DeliveryStatus, next_try
from core.store.models import Webhook, WebhookDelivery, WebhookEvent
from core.store.paging import Page, paginate


def create_webhook(
    session: Session,
    workspace_id: str,
    url: str,
    events: Sequence[str],
    description: str | None,
    now: datetime,
) -> tuple[Webhook, str]:
    """A new webhook and its secret (64 hex characters: 32 random bytes)."""
    secret = secrets.token_hex(32)
    row = Webhook(
        id=ids.new_id(),
        workspace_id=workspace_id,
        url=url,
        events=",".join(sorted(set(events))),
        description=description,
        secret=secret,
        created_at=now,
    )
    session.add(row)
    session.flush()
    return row, secret


def list_webhooks(session: Session, workspace_id: str, limit: int, offset: int) -> Page[Webhook]:
    """The workspace's webhooks, newest first."""
    query = (
        select(Webhook)
        .where(Webhook.workspace_id == workspace_id)
        .order_by(Webhook.created_at.desc(), Webhook.id.desc())
    )
    return paginate(session, query, limit, offset)


def find_webhook(session: Session, workspace_id: str, webhook_id: str) -> Webhook:
    """WebhookNotFound for an unknown id or one of another workspace."""
    row = session.get(Webhook, ids.normalize_uuid(webhook_id))
    if row is None or row.workspace_id != workspace_id:
        raise WebhookNotFound()
    return row


def delete_webhook(session: Session, workspace_id: str, webhook_id: str) -> None:
    """The webhook and (by the foreign key's cascade) its deliveries; none is tried again."""
    session.delete(find_webhook(session, workspace_id, webhook_id))
    session.flush()


def list_deliveries(
    session: Session, workspace_id: str, webhook_id: str, limit: int, offset: int
) -> Page[WebhookDelivery]:
    """One webhook's delivery records, newest first."""
    found = find_webhook(session, workspace_id, webhook_id)
    query = (
        select(WebhookDelivery)
        .where(WebhookDelivery.webhook_id == found.id)
        .order_by(WebhookDelivery.created_at.desc(), WebhookDelivery.id.desc())
    )
    return paginate(session, query, limit, offset)


def serialize_webhook(row: Webhook, secret: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": row.id,
        "url": row.url,
        "events": row.events.split(","),
        "description": row.description,
        "createdAt": isoformat(row.created_at),
    }
    if secret is not None:
        out["secret"] = secret
    return out


def _instant(moment: datetime | None) -> str | None:
    return None if moment is None else isoformat(moment)


def serialize_delivery(row: WebhookDelivery) -> dict[str, Any]:
    return {
        "id": row.id,
        "eventId": row.event_id,
        "eventType": row.event_type,
        "attempt": row.attempt,
        "status": row.status,
        "responseStatus": row.response_status,
        "error": row.error,
        "createdAt": isoformat(row.created_at),
        "nextAttemptAt": _instant(row.next_attempt_at),
        "deliveredAt": _instant(row.delivered_at),
    }


# --- the delivery worker's queries ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DueDelivery:
    """A delivery this worker holds the lease of, with what a try needs."""

    id: str
    url: str
    secret: str
    event_id: str
    payload: dict[str, Any]
    #: the tries made before this one
    tries: int
    created_at: datetime
    lease_until: datetime


def find_due(
    session: Session, now: datetime, limit: int, workspace_id: str | None = None
) -> list[str]:
    """Ids of pending deliveries due at ``now``, the longest waiting first (only those of
    ``workspace_id`` when given). A read: cheap enough to poll, it takes no write lock."""
    query = (
        select(WebhookDelivery.id)
        .where(
            WebhookDelivery.status == DeliveryStatus.PENDING.value,
            WebhookDelivery.next_attempt_at <= now,
        )
        .order_by(WebhookDelivery.next_attempt_at, WebhookDelivery.id)
        .limit(limit)
    )
    if workspace_id is not None:
        query = query.join(Webhook, Webhook.id == WebhookDelivery.webhook_id).where(
            Webhook.workspace_id == workspace_id
        )
    return list(session.scalars(query))


def lease(
    session: Session, delivery_ids: Sequence[str], now: datetime, until: datetime
) -> list[DueDelivery]:
    """Take the deliveries of ``delivery_ids`` that are still pending and due, until ``until``;
    those another worker took meanwhile are left out. Run in a write transaction."""
    if not delivery_ids:
        return []
    taken = session.execute(
        update(WebhookDelivery)
        .where(
            WebhookDelivery.id.in_(delivery_ids),
            WebhookDelivery.status == DeliveryStatus.PENDING.value,
            WebhookDelivery.next_attempt_at <= now,
        )
        .values(next_attempt_at=until)
        .returning(WebhookDelivery.id)
        .execution_options(synchronize_session=False)
    )
    leased = [row[0] for row in taken]
    if not leased:
        return []
    rows = session.execute(
        select(
            WebhookDelivery.id,
            Webhook.url,
            Webhook.secret,
            WebhookEvent.id,
            WebhookEvent.payload,
            WebhookDelivery.attempt,
            WebhookDelivery.created_at,
        )
        .join(Webhook, Webhook.id == WebhookDelivery.webhook_id)
        .join(WebhookEvent, WebhookEvent.id == WebhookDelivery.event_id)
        .where(WebhookDelivery.id.in_(leased))
        .order_by(WebhookDelivery.id)
    )
    return [
        DueDelivery(
            id=row[0],
            url=row[1],
            secret=row[2],
            event_id=row[3],
            payload=row[4],
            tries=row[5],
            created_at=row[6],
            lease_until=until,
        )
        for row in rows
    ]


@dataclass(frozen=True, slots=True)
class TryResult:
    """What one try came to: delivered (a 2xx answer) or not, the answer's status if there
    was one, and why it failed."""

    delivered: bool
    response_status: int | None = None
    error: str | None = None


def record_try(
    session: Session, due: DueDelivery, result: TryResult, now: datetime
) -> DeliveryStatus | None:
    """Count the try and set what follows: delivered; or pending until the next try; or
    failed, when that would be more than 24 hours after the event. None when the lease was
    lost meanwhile (the webhook was deleted, or the try outlasted the lease and another worker
    took the delivery over): nothing is recorded then."""
    tries = due.tries + 1
    values: dict[str, Any] = {
        "attempt": WebhookDelivery.attempt + 1,
        "response_status": result.response_status,
        "error": None if result.delivered else result.error,
    }
    if result.delivered:
        status = DeliveryStatus.DELIVERED
        values.update(next_attempt_at=None, delivered_at=now)
    else:
        due_next = next_try(tries, due.created_at, now)
        status = DeliveryStatus.PENDING if due_next is not None else DeliveryStatus.FAILED
        values.update(next_attempt_at=due_next)
    values["status"] = status.value
    changed = session.execute(
        update(WebhookDelivery)
        .where(
            WebhookDelivery.id == due.id,
            WebhookDelivery.status == DeliveryStatus.PENDING.value,
            WebhookDelivery.next_attempt_at == due.lease_until,
        )
        .values(values)
        .execution_options(synchronize_session=False)
    )
    return status if getattr(changed, "rowcount", 0) == 1 else None
