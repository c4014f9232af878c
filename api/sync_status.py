"""``GET /v1/sync-status`` (an extension of the spec): what the GitOps controller last applied
to the caller's workspace. Any scope."""

from __future__ import annotations

from typing import Any

from flask import Blueprint

from api.context import principal, services
from core.store.sync_status import read_status, serialize_status

bp = Blueprint("sync_status", __name__)


@bp.get("/v1/sync-status")
def get() -> dict[str, Any]:
    with services().db.transaction() as session:
        return serialize_status(read_status(session, principal().workspace_id))
