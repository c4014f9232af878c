"""``/v1/audit-logs``: query the audit log (newest first), export it as CSV or as the chain's
JSON Lines, and the chain's signed checkpoint and public key (decisions §7). Read-only keys may
do all of it: an auditor must not need a key that can change anything."""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import replace
from datetime import timedelta
from typing import Any

from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from flask import Blueprint, Response, stream_with_context

from api import streaming
from api.auth import takes_query
from api.context import now, principal, services
from api.params import back_from, read_instant, read_paging, read_query, whole_number
from core.domain.auditchain import VerifierKey
from core.domain.auditcounts import DAY, HOUR, MINUTE, floor_to
from core.domain.clock import isoformat
from core.domain.cursors import CursorError, open_cursor, seal, secret_of
from core.domain.errors import ValidationError
from core.domain.validation import require_session_id, require_uuid
from core.store import audit, auditpages, auditstats, chain, parquet, retention

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
        since=read_instant(query, "from"),
        until=read_instant(query, "to"),
        seq_from=whole_number(query, "seq_from", minimum=1),
        seq_to=whole_number(query, "seq_to", minimum=1),
    )


@bp.get("")
@takes_query(*FILTERS, "limit", "offset", "cursor")
def list_() -> dict[str, Any]:
    """A page, newest first, by cursor or by offset (decisions §9): either way the page after
    it is ``nextCursor``, and ``total`` counts every match now."""
    query = read_query()
    filters = _filters(query)
    limit, offset = read_paging(query, max_limit=1000)
    workspace_id = principal().workspace_id
    secret = _cursor_secret()
    after = None
    if "cursor" in query:
        if offset:
            raise ValidationError.field("cursor", "cannot be combined with an offset other than 0")
        try:
            after = open_cursor(query["cursor"], workspace_id, filters.canonical(), secret)
        except CursorError as exc:
            raise ValidationError.field("cursor", str(exc)) from None
    with services().db.transaction(snapshot=True) as session:
        page = auditpages.list_page(session, workspace_id, filters, limit, offset, after)
        data = [audit.serialize_entry(entry) for entry in page.items]
    following = None
    if page.next is not None:
        following = seal(page.next, workspace_id, filters.canonical(), secret)
    return {
        "data": data,
        "pagination": {
            "limit": limit,
            "offset": offset,
            "count": len(data),
            "total": page.total,
            "nextCursor": following,
        },
    }


def _cursor_secret() -> bytes:
    key = services().audit_key()
    return secret_of(key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption()))


STATS_FILTERS = {"agent_id", "tool_name", "result", "session_id", "from", "to"}
BUCKETS = {"minute": MINUTE, "hour": HOUR, "day": DAY}
STATS_LIMIT = 10_000


@bp.get("/stats")
@takes_query(*STATS_FILTERS, "bucket", "group_by")
def stats() -> dict[str, Any]:
    """Counts of entries over time (decisions §9), from the counts kept as entries were
    committed: ``{data: [{start, key, count}]}``, empty buckets left out."""
    query = read_query()
    bucket = query.pop("bucket", "hour")
    if bucket not in BUCKETS:
        raise ValidationError.field("bucket", "must be one of: minute, hour, day")
    group_by = query.pop("group_by", None)
    if group_by is not None and group_by not in auditstats.GROUP_COLUMNS:
        raise ValidationError.field("group_by", "must be one of: result, agent, tool")
    filters = _filters(query)
    until = filters.until or now()
    since = filters.since or back_from(until, timedelta(days=1))
    if since > until:
        raise ValidationError.field("from", "must not be after to")
    grain = BUCKETS[bucket]
    first, last = floor_to(since, grain), floor_to(until, grain)
    buckets = (last - first) // timedelta(seconds=grain) + 1
    if buckets > STATS_LIMIT:
        raise ValidationError.field(
            "bucket",
            f"the range holds {buckets} buckets of a {bucket}, more than {STATS_LIMIT}: "
            "narrow from and to, or take a longer bucket",
        )
    ranged = replace(filters, since=since, until=until)
    start, end = auditstats.bounds(ranged)
    with services().db.transaction(snapshot=True) as session:
        rows = auditstats.series(
            session, principal().workspace_id, ranged, start, end, grain, group_by
        )
    if len(rows) > STATS_LIMIT:
        raise ValidationError.field(
            "group_by",
            f"the answer would hold {len(rows)} items, more than {STATS_LIMIT}: narrow from "
            "and to, take a longer bucket, or filter",
        )
    return {
        "data": [
            {"start": isoformat(auditstats.instant(b)), "key": key, "count": n}
            for b, key, n in rows
        ]
    }


@bp.get("/export")
@takes_query(*FILTERS, "format")
def export() -> Response:
    query = read_query()
    kind = query.pop("format", "csv")
    if kind not in ("csv", "jsonl", "parquet"):
        raise ValidationError.field("format", "must be csv, jsonl or parquet")
    filters = _filters(query)
    if kind != "csv":
        return _export_chain(filters, kind)
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
    return streaming.mark(response)


def _export_chain(filters: audit.Filters, kind: str) -> Response:
    """Every entry of a seq range, oldest first, as JSON Lines: what ``agentauth audit verify
    --export`` and a third party's own verifier read (the other filters narrow it too, and an
    export so narrowed no longer verifies: entries are missing from it); or the same entries
    as a Parquet file (``core.store.parquet``)."""
    workspace_id = principal().workspace_id
    stack = ExitStack()
    session = stack.enter_context(services().db.transaction(snapshot=True))
    try:
        # pruned entries a removal has not reached yet are in an archive already: not here
        pruned, _ = retention.pruned_head(session, workspace_id)
        first = max(filters.seq_from or 1, pruned + 1)
        entries = chain.entries(session, workspace_id, first, filters.seq_to, filters)
        if kind == "parquet":
            with stack:  # written whole before it is sent: the transaction is done with
                return _parquet(entries)
    except BaseException:
        stack.close()
        raise
    response = Response(stream_with_context(chain.jsonl(entries)), mimetype="application/jsonl")
    response.call_on_close(stack.close)
    filename = f"svc-audit-log-{now().date().isoformat()}.jsonl"
    response.headers["Content-Disposition"] = f'attachment; filename="{filename}"'
    return streaming.mark(response)


def _parquet(entries: Iterator[dict[str, Any]]) -> Response:
    """``entries`` as a Parquet file, written to a file of no name (its footer comes last) and
    sent from it: at most the settings' ``parquet_export_limit`` of them, which bounds that
    file and the wait for its first byte, the answer saying when there were more, as the CSV
    export does."""
    limit = services().settings.parquet_export_limit
    spool = tempfile.TemporaryFile(prefix="agentauth-parquet-")  # noqa: SIM115
    try:
        parquet.write(itertools.islice(entries, limit), spool)
        truncated = next(entries, None) is not None
    except BaseException:
        spool.close()
        raise
    spool.seek(0)
    response = Response(iter(lambda: spool.read(256 * 1024), b""), mimetype=parquet.MEDIA_TYPE)
    response.call_on_close(spool.close)
    filename = f"svc-audit-log-{now().date().isoformat()}.parquet"
    response.headers["Content-Disposition"] = f'attachment; filename="{filename}"'
    if truncated:
        response.headers["X-Svc-Export-Truncated"] = "true"
        response.headers["X-Svc-Export-Limit"] = str(limit)
    return streaming.mark(response)


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


@bp.get("/retention")
@takes_query()
def kept() -> dict[str, Any]:
    """What the log keeps (decisions §9): the entries listed now, the whole log's size, the
    oldest entry kept and the last prune with its archive."""
    with services().db.transaction(snapshot=True) as session:
        found = retention.kept(session, principal().workspace_id)
    oldest, pruned = found.oldest, found.last_prune
    return {
        "kept": found.kept,
        "size": found.size,
        "prunedThrough": found.pruned_through,
        "oldest": None if oldest is None else {"seq": oldest[0], "timestamp": isoformat(oldest[1])},
        "lastPrune": None if pruned is None else _prune_of(pruned),
    }


def _prune_of(pruned: retention.LastPrune) -> dict[str, Any]:
    return {
        "seq": pruned.seq,
        "at": isoformat(pruned.at),
        "first": pruned.first,
        "last": pruned.last,
        "archive": pruned.archive,
        "reason": pruned.reason,
    }
