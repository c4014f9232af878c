"""The sync status of a workspace: which revision of its policy repository the controller last
tried to apply, with what result, and which one is in force. Written by ``controller.apply``;
read here for ``GET /v1/sync-status`` and the CLI."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.domain.clock import isoformat
from core.store.models import SyncStatus


def read_status(session: Session, workspace_id: str) -> SyncStatus | None:
    return session.get(SyncStatus, workspace_id)


def applied_revisions(session: Session) -> list[tuple[str, str, datetime]]:
    """(workspace id, revision, applied at) of every workspace with an applied revision."""
    rows = session.execute(
        select(SyncStatus.workspace_id, SyncStatus.applied_revision, SyncStatus.applied_at)
        .where(SyncStatus.applied_revision.is_not(None), SyncStatus.applied_at.is_not(None))
        .order_by(SyncStatus.workspace_id)
    )
    return [(w, r, at) for w, r, at in rows if r is not None and at is not None]


def serialize_status(status: SyncStatus | None) -> dict[str, Any]:
    """The API's view; every member null when no repository was ever applied."""
    if status is None:
        return {
            "source": None,
            "result": None,
            "lastAttemptedRevision": None,
            "lastAttemptedAt": None,
            "lastAppliedRevision": None,
            "lastAppliedAt": None,
            "error": None,
            "changes": None,
        }
    return {
        "source": status.source,
        "result": status.result,
        "lastAttemptedRevision": status.attempted_revision,
        "lastAttemptedAt": isoformat(status.attempted_at),
        "lastAppliedRevision": status.applied_revision,
        "lastAppliedAt": isoformat(status.applied_at) if status.applied_at else None,
        "error": status.error,
        "changes": status.changes,
    }
