"""``/v1/api-keys``: create (the full key is returned once), list (extension), revoke; and
``/v1/whoami``: the caller's own key (extension), so a client learns its scopes by reading."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response

from api.auth import requires, takes_query
from api.context import now, principal, services
from api.params import path_id, read_body, read_paging, read_query
from core.domain.clock import parse_instant
from core.domain.errors import ValidationError
from core.store import keys
from core.store.keys import Scope

bp = Blueprint("api_keys", __name__, url_prefix="/v1/api-keys")
whoami_bp = Blueprint("whoami", __name__)


@bp.post("")
@requires(Scope.ADMIN)
def create() -> tuple[dict[str, Any], int]:
    body = read_body("api-key.json#/$defs/create")
    expires_at = None
    if body.get("expiresAt") is not None:
        try:
            expires_at = parse_instant(body["expiresAt"])
        except ValueError:
            raise ValidationError.field("expiresAt", "must be an ISO 8601 date-time") from None
        if expires_at <= now():
            raise ValidationError.field("expiresAt", "must be in the future")
    caller = principal()
    with services().db.transaction(write=True) as session:
        row, key = keys.issue_key(
            session, caller.workspace_id, body["name"], body["scopes"], expires_at, now()
        )
        return keys.serialize_key(row, key), 201


@bp.get("")
@requires(Scope.ADMIN)
@takes_query("limit", "offset")
def list_() -> dict[str, Any]:
    limit, offset = read_paging(read_query(), max_limit=200)
    with services().db.transaction() as session:
        page = keys.list_keys(session, principal().workspace_id, limit, offset)
        return page.envelope(keys.serialize_key)


@bp.delete("/<key_id>")
@requires(Scope.ADMIN)
def revoke(key_id: str) -> Response:
    wanted = path_id(key_id)
    with services().db.transaction(write=True) as session:
        keys.revoke_key(session, principal().workspace_id, wanted, now())
    return Response(status=204)


@whoami_bp.get("/v1/whoami")
def whoami() -> dict[str, Any]:
    """Any key: its own API Key object (never the full key), scopes included."""
    caller = principal()
    with services().db.transaction() as session:
        return keys.serialize_key(keys.get_key(session, caller.workspace_id, caller.key_id))
