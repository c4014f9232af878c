"""``/v1/webhooks`` (decisions §6, admin only): create (the secret is returned once), list,
delete, and a webhook's delivery records. The deliveries themselves are ``api.outbox``'s."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response

from api.auth import requires, takes_query
from api.context import now, principal, services
from api.delivery import Unreachable, check_url
from api.params import path_id, read_body, read_paging, read_query
from core.domain.errors import ValidationError
from core.store import webhooks
from core.store.keys import Scope

bp = Blueprint("webhooks", __name__, url_prefix="/v1/webhooks")


@bp.post("")
@requires(Scope.ADMIN)
def create() -> tuple[dict[str, Any], int]:
    body = read_body("webhook.json#/$defs/create")
    try:
        # resolved here to refuse it early; every delivery resolves and checks it again
        check_url(body["url"], services().settings.webhook_allow_private)
    except Unreachable as exc:
        raise ValidationError.field("url", str(exc)) from None
    with services().db.transaction(write=True) as session:
        row, secret = webhooks.create_webhook(
            session,
            principal().workspace_id,
            body["url"],
            body["events"],
            body.get("description"),
            now(),
        )
        return webhooks.serialize_webhook(row, secret), 201


@bp.get("")
@requires(Scope.ADMIN)
@takes_query("limit", "offset")
def list_() -> dict[str, Any]:
    limit, offset = read_paging(read_query(), max_limit=200)
    with services().db.transaction() as session:
        page = webhooks.list_webhooks(session, principal().workspace_id, limit, offset)
        return page.envelope(webhooks.serialize_webhook)


@bp.delete("/<webhook_id>")
@requires(Scope.ADMIN)
def delete(webhook_id: str) -> Response:
    wanted = path_id(webhook_id)
    with services().db.transaction(write=True) as session:
        webhooks.delete_webhook(session, principal().workspace_id, wanted)
    return Response(status=204)


@bp.get("/<webhook_id>/deliveries")
@requires(Scope.ADMIN)
@takes_query("limit", "offset")
def deliveries(webhook_id: str) -> dict[str, Any]:
    wanted = path_id(webhook_id)
    limit, offset = read_paging(read_query(), max_limit=200)
    with services().db.transaction() as session:
        page = webhooks.list_deliveries(session, principal().workspace_id, wanted, limit, offset)
        return page.envelope(webhooks.serialize_delivery)
