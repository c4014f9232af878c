"""One page of the audit list (decisions §9), newest first, read by an index walk whose work
never grows with the log: after a cursor's position, or at an ``offset`` found through the
counts (``core.store.auditstats``) rather than by stepping over the entries before it.

The walk follows the index of one filter (a session, an agent or a tool, in that order of
preference, or time alone: each index is ``(workspace, column, timestamp, id)``) and checks the
other filters on the entries it meets. It looks at most
:data:`SCAN_LIMIT` index entries a page: a page whose other filters match rarely may then hold
fewer than ``limit`` entries, or none, and still name the page after it. A walk serves only
entries up to the ``seq`` that was the chain's head when it started, so entries committed
meanwhile never appear in it. Called by ``api/audit_logs.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import and_, select, tuple_
from sqlalchemy.orm import Session

from core.domain.auditcounts import HOUR, MINUTE, Piece
from core.domain.cursors import Position
from core.store import auditstats
from core.store.audit import Filters, clauses, time_clauses
from core.store.models import AuditEntry, AuditHead

#: how many index entries one page may look through
SCAN_LIMIT = 10_000
_ORDER = (AuditEntry.timestamp.desc(), AuditEntry.id.desc())
_LEADS = (
    ("session_id", AuditEntry.session_id),
    ("agent_id", AuditEntry.agent_id),
    ("tool_name", AuditEntry.tool_name),
)


@dataclass(frozen=True)
class Listing:
    items: list[AuditEntry]
    total: int
    #: where the next page starts, or None when this page is the last
    next: Position | None


def list_page(
    session: Session,
    workspace_id: str,
    filters: Filters,
    limit: int,
    offset: int = 0,
    after: Position | None = None,
) -> Listing:
    """The page after ``after`` (a cursor's position), or at ``offset``; with the total of
    the matches now. Run it in a snapshot transaction: the total, the head and the page must
    see one state of the log."""
    total = auditstats.count(session, workspace_id, filters)
    if total == 0:  # nothing to walk to (an action that never happened, say)
        return Listing([], 0, None)
    if after is not None:
        seq_max, start, inclusive = after.seq_max, (after.timestamp, after.id), False
    else:
        seq_max = _head(session, workspace_id)
        start, inclusive = None, False
        if offset:
            found = _locate(session, workspace_id, filters, offset)
            if found is None:
                return Listing([], total, None)
            start, inclusive = found, True
    items, last = _walk(session, workspace_id, filters, limit, seq_max, start, inclusive)
    following = None if last is None else Position(seq_max, last[0], last[1])
    return Listing(items, total, following)


def _head(session: Session, workspace_id: str) -> int:
    found = session.scalar(select(AuditHead.seq).where(AuditHead.workspace_id == workspace_id))
    return int(found or 0)


def _lead(filters: Filters) -> list[Any]:
    """What the walk's index answers besides the workspace: one filter, the time range."""
    where: list[Any] = []
    for name, column in _LEADS:
        value = getattr(filters, name)
        if value is not None:
            where.append(column == value)
            break
    return where + time_clauses(filters)


def _walk(
    session: Session,
    workspace_id: str,
    filters: Filters,
    limit: int,
    seq_max: int,
    start: tuple[Any, str] | None,
    inclusive: bool,
) -> tuple[list[AuditEntry], tuple[Any, str] | None]:
    """Up to ``limit`` matching entries from ``start`` on, and where the next page starts
    (None: the walk has met every entry). Chunks of the lead index, growing, each bounded by
    its last index entry; at most SCAN_LIMIT index entries in all."""
    lead = [AuditEntry.workspace_id == workspace_id, *_lead(filters)]
    rest = [*clauses(filters), AuditEntry.erased.is_(False), AuditEntry.seq <= seq_max]
    key = tuple_(AuditEntry.timestamp, AuditEntry.id)
    found: list[AuditEntry] = []
    scanned, chunk = 0, limit + 1
    while True:
        where = list(lead)
        if start is not None:  # and its time plainly: PostgreSQL skips the later days then
            where += [key <= start if inclusive else key < start, AuditEntry.timestamp <= start[0]]
        edge_row = session.execute(
            select(AuditEntry.timestamp, AuditEntry.id)
            .where(*where)
            .order_by(*_ORDER)
            .offset(chunk - 1)
            .limit(1)
        ).first()
        edge = None if edge_row is None else (edge_row[0], edge_row[1])
        # the chunk's entries by id, from the lead index: ordered by time alone, a database
        # may walk the time index instead, past every entry of the log but the few it wants
        wanted = limit + 1 - len(found)
        found += session.scalars(
            select(AuditEntry)
            .where(_in_chunk(session, where, chunk, edge), *rest)
            .order_by(*_ORDER)
            .limit(wanted)
        )
        if len(found) > limit:
            last = found[limit - 1]
            return found[:limit], (last.timestamp, last.id)
        if edge is None:
            return found, None
        scanned += chunk
        start, inclusive = edge, False
        if scanned >= SCAN_LIMIT:
            return found, edge
        chunk = min(chunk * 4, SCAN_LIMIT - scanned)


def _in_chunk(session: Session, where: list[Any], chunk: int, edge: tuple[Any, str] | None) -> Any:
    """An entry is among the first ``chunk`` of the lead index under ``where`` (``edge`` its
    last, None when the index has no more). SQLite: by id, from a subquery. PostgreSQL: the
    lead index's range down to the edge, with the edge's time as a plain bound too, so that
    only the chunk's days' partitions are looked in (with a subquery PostgreSQL may scan every
    partition whole for a filter it thinks rare; by a list of the chunk's ids, it probed each
    id in each of those days' partitions: 300 ms for a sparse filter at a million entries)."""
    if session.get_bind().dialect.name != "postgresql":
        ordered = select(AuditEntry.id).where(*where).order_by(*_ORDER)
        return AuditEntry.id.in_(ordered.limit(chunk))
    if edge is None:  # the rest of the index: no lower bound
        return and_(*where)
    key = tuple_(AuditEntry.timestamp, AuditEntry.id)
    return and_(*where, key >= edge, AuditEntry.timestamp >= edge[0])


def _locate(
    session: Session, workspace_id: str, filters: Filters, offset: int
) -> tuple[Any, str] | None:
    """The ``(timestamp, id)`` of the match ``offset`` places after the newest (None: there
    are not that many): the counts of hours, then of one hour's minutes, say where it is; the
    entries of one minute, at most, are stepped over."""
    start, end = auditstats.bounds(filters)
    if auditstats.kind_of(filters) is None:  # a session's or a seq range's: few entries
        return _nth(session, workspace_id, filters, Piece(None, start, end), offset)
    remaining = offset
    for grain in (HOUR, MINUTE):
        rows = auditstats.series(session, workspace_id, filters, start, end, grain, None)
        for bucket, _, n in reversed(rows):
            if remaining < n:
                low = auditstats.instant(bucket)
                high = low + timedelta(seconds=grain)
                start = low if start is None else max(start, low)
                end = high if end is None else min(end, high)
                break
            remaining -= n
        else:
            return None
    return _nth(session, workspace_id, filters, Piece(None, start, end), remaining)


def _nth(
    session: Session, workspace_id: str, filters: Filters, part: Piece, n: int
) -> tuple[Any, str] | None:
    where = auditstats.entry_where(workspace_id, filters, part)
    row = session.execute(
        select(AuditEntry.timestamp, AuditEntry.id)
        .where(*where)
        .order_by(*_ORDER)
        .offset(n)
        .limit(1)
    ).first()
    return None if row is None else (row[0], row[1])
