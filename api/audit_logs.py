"""``/v1/audit-logs``: query the audit log (newest first), export it as CSV or as the chain's
JSON Lines, and the chain's signed checkpoint and public key (decisions §7). Read-only keys may
do all of it: an auditor must not need a key that can change anything."""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

from flask import Blueprint, Response, stream_with_context

from api.auth import takes_query
from api.context import now, principal, services
from api.params import read_paging, read_query, whole_number
from core.domain.auditchain import VerifierKey
from core.domain.clock import parse_instant
from core.domain.errors import ValidationError
from core.domain.validation import require_session_id, require_uuid
from core.store import audit, chain

bp = Blueprint("audit_logs", __name__, url_prefix="/v1/audit-logs")
FILTERS = {"agent_id", "session_id", "action", "tool_name", "result", "from", "to"}
FILTERS |= {"seq_from", "seq_to"}


def _filters(query: dict[str, str]) -> audit.Filters:
    result = query.get("result")
    if result is not None and result not in audit.RESULTS:
        raise ValidationError.field("result", "must be one of: " + ", ".join(audit.RESULTS))
    agent_id, session_id = query.get("agent_id"), query.get("session_id")
    return audit.Filters(
        agent_id=require_uuid(agent_id, "agent_id") if agent_id is not None else None,
        session_id=require_session_id(session_id) if session_id is not None else None,
        action=query.get("action"),
        tool_name=query.get("tool_name"),
        result=result,
        since=_instant(query, "from"),
        until=_instant(query, "to"),
        seq_from=whole_number(query, "seq_from", minimum=1),
        seq_to=whole_number(query, "seq_to", minimum=1),
    )


def _instant(query: dict[str, str], name: str) -> Any:
    raw = query.get(name)
    if raw is None:
        return None
    try:
        return parse_instant(raw)
    except ValueError:
        raise ValidationError.field(name, "must be an ISO 8601 date-time") from None


@bp.get("")
@takes_query(*FILTERS, "limit", "offset")
def list_() -> dict[str, Any]:
    query = read_query()
    filters = _filters(query)
    limit, offset = read_paging(query, max_limit=1000)
    with services().db.transaction() as session:
        page = audit.query(session, principal().workspace_id, filters, limit, offset)
        return page.envelope(audit.serialize_entry)


@bp.get("/export")
@takes_query(*FILTERS, "format")
def export() -> Response:
    query = read_query()
    kind = query.pop("format", "csv")
    if kind not in ("csv", "jsonl"):
        raise ValidationError.field("format", "must be csv or jsonl")
    filters = _filters(query)
    if kind == "jsonl":
        return _export_chain(filters)
    workspace_id = principal().workspace_id
    stack = ExitStack()
    session = stack.enter_context(services().db.transaction(snapshot=True))
    try:
        truncated = audit.is_export_truncated(session, workspace_id, filters)
    except BaseException:
        stack.close()
        raise
    rows = audit.export_rows(session, workspace_id, filters)
    response = Response(stream_with_context(rows), mimetype="text/csv")
    response.call_on_close(stack.close)
    filename = f"svc-audit-log-{now().date().isoformat()}.csv"
    response.headers["Content-Disposition"] = f'attachment; filename="{filename}"'
    if truncated:
        response.headers["X-Svc-Export-Truncated"] = "true"
        response.headers["X-Svc-Export-Limit"] = str(audit.EXPORT_LIMIT)
    return response


def _export_chain(filters: audit.Filters) -> Response:
    """Every entry of a seq range, oldest first, as JSON Lines: what ``agentauth audit verify
    --export`` and a third party's own verifier read (the other filters narrow it too, and an
    export so narrowed no longer verifies: entries are missing from it)."""
    workspace_id = principal().workspace_id
    stack = ExitStack()
    session = stack.enter_context(services().db.transaction(snapshot=True))
    entries = chain.entries(session, workspace_id, filters.seq_from, filters.seq_to, filters)
    lines = chain.jsonl(entries)
    response = Response(stream_with_context(lines), mimetype="application/jsonl")
    response.call_on_close(stack.close)
    filename = f"svc-audit-log-{now().date().isoformat()}.jsonl"
    response.headers["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


@bp.get("/checkpoint")
@takes_query()
def checkpoint() -> Response:
    """The chain's current size and head, signed: keep these away from the database."""
    key = services().audit_key()
    with services().db.transaction() as session:
        note = chain.checkpoint(session, principal().workspace_id, key)
    return Response(note, mimetype="text/plain")


@bp.get("/public-key")
@takes_query()
def public_key() -> Response:
    """The C2SP verifier key of the checkpoints' signatures."""
    return Response(VerifierKey.of(services().audit_key()).text() + "\n", mimetype="text/plain")
