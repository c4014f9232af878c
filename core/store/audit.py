"""The audit log: an entry's row (redacted), its place in the chain, query, export and
erasure. Entries are never updated or deleted by this code (the database refuses it, too),
except that deleting their agent erases their content and keeps their chain leaves (§7).

Called by ``core.hotpath.decisions`` (the row, which the recorder writes inside the decision's
transaction and chains), ``core.store.agents`` (erasure), ``core.store.auditchain`` (reading the
chain back) and ``api/audit_logs.py`` (query, export).
"""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, func, select, update
from sqlalchemy.orm import Session

from core.domain import ids
from core.domain.auditchain import HASH_VERSION, Leaf
from core.domain.auditcounts import Signature, signature_of
from core.domain.clock import isoformat
from core.domain.modes import WouldBe
from core.domain.redaction import redact, scrub
from core.store import auditcounts
from core.store.models import AuditEntry, AuditHead
from core.store.paging import Page, paginate

RESULTS = ("allowed", "denied", "escalated")
EXPORT_LIMIT = 5000
EXPORT_COLUMNS = (
    "Timestamp", "Agent ID", "Tool", "Result", "Reason", "Latency (ms)", "Parameters",
    "Would-be result", "Would-be policy ID", "Would-be reason",
)  # fmt: skip
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


@dataclass(frozen=True)
class Filters:
    """The audit query's filters; None means "any"."""

    agent_id: str | None = None
    session_id: str | None = None
    action: str | None = None
    tool_name: str | None = None
    result: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    #: the entries' places in the chain, inclusive
    seq_from: int | None = None
    seq_to: int | None = None

    def canonical(self) -> str:
        """The filters as one text, the same for the same filters however they were written
        (what a cursor is bound to)."""
        values = {
            name: isoformat(value) if isinstance(value, datetime) else value
            for name, value in sorted(vars(self).items())
            if value is not None
        }
        return json.dumps(values, sort_keys=True, separators=(",", ":"))

    @property
    def by_content(self) -> bool:
        """Whether a filter looks at what entries say (which erased entries no longer do)."""
        return any(
            value is not None
            for value in (
                self.agent_id, self.session_id, self.action, self.tool_name, self.result,
                self.since, self.until,
            )
        )  # fmt: skip


def clauses(filters: Filters) -> list[Any]:
    """The WHERE conditions of ``filters`` (beside the workspace's)."""
    found: list[Any] = [
        column == value
        for column, value in (
            (AuditEntry.agent_id, filters.agent_id),
            (AuditEntry.session_id, filters.session_id),
            (AuditEntry.action, filters.action),
            (AuditEntry.tool_name, filters.tool_name),
            (AuditEntry.result, filters.result),
        )
        if value is not None
    ]
    found += time_clauses(filters)
    if filters.seq_from is not None:
        found.append(AuditEntry.seq >= filters.seq_from)
    if filters.seq_to is not None:
        found.append(AuditEntry.seq <= filters.seq_to)
    return found


def time_clauses(filters: Filters) -> list[Any]:
    """The conditions of ``filters``' time range (``to`` inclusive)."""
    found: list[Any] = []
    if filters.since is not None:
        found.append(AuditEntry.timestamp >= filters.since)
    if filters.until is not None:
        found.append(AuditEntry.timestamp <= filters.until)
    return found


def entry(
    *,
    workspace_id: str,
    agent_id: str,
    agent_exists: bool,
    key_id: str | None,
    tool_name: str,
    parameters: dict[str, Any],
    result: str,
    policy_id: str | None,
    rule_index: int | None,
    reason: str,
    latency_ms: float,
    timestamp: datetime,
    approval_id: str | None = None,
    session_id: str | None = None,
    action: str = "authorize",
    redacted: dict[str, Any] | None = None,
    would_be: WouldBe | None = None,
) -> dict[str, Any]:
    """One entry's row, with a new id: parameters redacted (``redacted``: ``redact(parameters)``
    when made already), API keys scrubbed from every text; ``would_be``: the would-be decision
    (decisions §10), None when the agent had no warn or shadow policy. Decisions write it
    through a group-commit batch (``core.hotpath.recorder``)."""
    return {
        "id": ids.new_sortable_id(),
        "workspace_id": workspace_id,
        "agent_id": agent_id,
        "agent_ref": agent_id if agent_exists else None,
        "key_id": key_id,
        "action": action,
        "tool_name": scrub(tool_name),
        "parameters": redact(parameters) if redacted is None else redacted,
        "result": result,
        "policy_id": policy_id,
        "rule_index": rule_index,
        "reason": scrub(reason),
        "latency_ms": latency_ms,
        "timestamp": timestamp,
        "approval_id": approval_id,
        "session_id": None if session_id is None else scrub(session_id),
        "hash_version": HASH_VERSION,
        "would_result": None if would_be is None else would_be.result,
        "would_policy_id": None if would_be is None else would_be.policy_id,
        "would_rule_index": None if would_be is None else would_be.rule_index,
        "would_reason": None if would_be is None else scrub(would_be.reason),
    }


def leaf(row: dict[str, Any], parameters_json: bytes | None = None) -> Leaf:
    """The chain leaf of a row made by :func:`entry`: its v1 fields as the API renders them
    (``parameters_json``: the row's parameters in canonical JSON, if made already)."""
    return Leaf.of(render_row(row.__getitem__), parameters_json)


def signature(row: dict[str, Any]) -> Signature:
    """What a row made by :func:`entry` says of itself for counting (decisions §9)."""
    return signature_of(
        agent_id=row["agent_id"],
        tool_name=row["tool_name"],
        session_id=row["session_id"],
        result=row["result"],
        action=row["action"],
        timestamp=row["timestamp"],
        would_policy_id=row["would_policy_id"],
        would_result=row["would_result"],
    )


#: what erasing an entry writes over its content (the database's guard checks these values)
ERASED: dict[str, Any] = {
    "agent_id": "",
    "agent_ref": None,
    "key_id": None,
    "action": "",
    "tool_name": "",
    "parameters": {},
    "result": "",
    "policy_id": None,
    "rule_index": None,
    "reason": "",
    "latency_ms": 0.0,
    "approval_id": None,
    "session_id": None,
    "would_result": None,
    "would_policy_id": None,
    "would_rule_index": None,
    "would_reason": None,
    "erased": True,
}


def erase(session: Session, workspace_id: str, agent_id: str, limit: int | None = None) -> int:
    """Erase the content of the workspace's agent's entries (at most ``limit`` of them, when
    given), keeping each one's seq, entry hash and hash, and take them out of the counts;
    entries at or before the pruned head are left to the prune's removal. How many were
    erased. Deleting an agent erases its entries a batch at a time, each in a transaction of
    its own, then the rest in the transaction that deletes it."""
    pruned = (
        select(AuditHead.pruned_seq).where(AuditHead.workspace_id == workspace_id).scalar_subquery()
    )
    # through the agent's index by time: an erased entry leaves it (its agent_id is cleared),
    # so each batch finds the next at once. Entries written when no such agent existed
    # (agent_ref NULL) are not its own and stay.
    described = select(
        AuditEntry.id,
        AuditEntry.workspace_id,
        AuditEntry.agent_id,
        AuditEntry.tool_name,
        AuditEntry.session_id,
        AuditEntry.result,
        AuditEntry.action,
        AuditEntry.timestamp,
        AuditEntry.would_policy_id,
        AuditEntry.would_result,
    ).where(
        AuditEntry.workspace_id == workspace_id,
        AuditEntry.agent_id == agent_id,
        AuditEntry.agent_ref == agent_id,
        AuditEntry.erased.is_(False),
        # a pruned entry is in its archive, and a prune's removal is taking it, with its
        # counts (a pruned hour's rollup rows may be gone already: taken back again here,
        # they would go below zero). "seq + 0": a bound on seq itself makes SQLite (no
        # statistics) walk the workspace's seq index from the pruned head instead, past every
        # entry erased so far and every other agent's, a walk that grew with each batch
        AuditEntry.seq + 0 > func.coalesce(pruned, 0),
    )
    if limit is not None:
        described = described.limit(limit)
    tally: Counter[Signature] = Counter()
    found: list[str] = []
    for row in session.execute(described.execution_options(yield_per=2000)):
        tally[signature(row._asdict())] += 1
        found.append(row.id)
    if not found:
        return 0
    # by the ids alone (the primary key): beside the workspace, SQLite walks the workspace's
    # whole time index and tests each entry against the list (44 ms a batch at 400,000
    # entries, 0.5 ms by the ids)
    erased: Any = session.execute(
        update(AuditEntry)
        .where(AuditEntry.id.in_(found))
        .values(ERASED)
        .execution_options(synchronize_session=False)
    )
    auditcounts.add(session, workspace_id, {s: -n for s, n in tally.items()})
    return int(erased.rowcount or 0)


def _select(workspace_id: str, filters: Filters) -> Select[AuditEntry]:
    query = select(AuditEntry).where(
        AuditEntry.workspace_id == workspace_id, AuditEntry.erased.is_(False), *clauses(filters)
    )
    return query.order_by(AuditEntry.timestamp.desc(), AuditEntry.id.desc())


def query(
    session: Session, workspace_id: str, filters: Filters, limit: int, offset: int
) -> Page[AuditEntry]:
    """One page, newest first; ties broken by id, so pages never overlap or skip."""
    return paginate(session, _select(workspace_id, filters), limit, offset)


def is_export_truncated(session: Session, workspace_id: str, filters: Filters) -> bool:
    """Whether more than EXPORT_LIMIT entries match (counts at most one past the limit)."""
    capped = _select(workspace_id, filters).order_by(None).limit(EXPORT_LIMIT + 1).subquery()
    return (session.scalar(select(func.count()).select_from(capped)) or 0) > EXPORT_LIMIT


def export_rows(session: Session, workspace_id: str, filters: Filters) -> Iterator[str]:
    """The CSV text, header first, newest entry first, at most EXPORT_LIMIT rows, produced a
    batch at a time rather than built in memory."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(EXPORT_COLUMNS)
    query = _select(workspace_id, filters).limit(EXPORT_LIMIT).execution_options(yield_per=500)
    for count, entry in enumerate(session.scalars(query), start=1):
        writer.writerow([_cell(value) for value in _export_values(entry)])
        if count % 500 == 0:
            yield _drain(buffer)
    yield _drain(buffer)


def _export_values(entry: AuditEntry) -> tuple[str, ...]:
    return (
        isoformat(entry.timestamp),
        entry.agent_id,
        entry.tool_name,
        entry.result,
        entry.reason,
        f"{entry.latency_ms:.3f}",
        json.dumps(entry.parameters, separators=(",", ":"), sort_keys=True),
        entry.would_result or "",
        entry.would_policy_id or "",
        entry.would_reason or "",
    )


def _cell(value: str) -> str:
    """Spreadsheets run cells starting with these characters as formulas: defuse them."""
    return "'" + value if value.startswith(_FORMULA_STARTS) else value


def _drain(buffer: io.StringIO) -> str:
    text = buffer.getvalue()
    buffer.seek(0)
    buffer.truncate()
    return text


def render_row(column: Any) -> dict[str, Any]:
    """An entry's fields as the API renders them, from ``column(name)``: the one rendering
    that the chain's hash covers and that clients read."""
    return {
        "id": column("id"),
        "agentId": column("agent_id"),
        "action": column("action"),
        "toolName": column("tool_name"),
        "parameters": column("parameters"),
        "result": column("result"),
        "policyId": column("policy_id"),
        "ruleIndex": column("rule_index"),
        "reason": column("reason"),
        "latencyMs": column("latency_ms"),
        "timestamp": isoformat(column("timestamp")),
        "approvalId": column("approval_id"),
        "sessionId": column("session_id"),
        "hashVersion": column("hash_version"),
        "wouldBe": render_would_be(column),
    }


def render_would_be(column: Any) -> dict[str, Any] | None:
    """An entry's ``wouldBe`` from ``column(name)``: null when it has no would-be decision."""
    result = column("would_result")
    if result is None:
        return None
    return {
        "result": result,
        "policyId": column("would_policy_id"),
        "ruleIndex": column("would_rule_index"),
        "reason": column("would_reason"),
    }


def serialize_entry(entry: AuditEntry) -> dict[str, Any]:
    rendered = render_row(entry.__getattribute__)
    rendered["seq"] = entry.seq
    rendered["hash"] = entry.hash
    return rendered
