"""The shadow report (decisions §10): what a policy's would-be decisions did over a time range,
exactly, from the counts kept as entries are committed (kind ``w`` of ``audit_counts``,
``core.domain.auditcounts``) and never from a scan of the log: whole hours and minutes are read
from the rollup rows (and the tallies not yet folded), the partial minutes at the range's
edges from the agent's entries through its index, and the newest changed entries through
their own partial index. Called by ``api/policies.py`` and ``controller`` (the evidence in
``plan`` and ``diff``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from core.domain.auditcounts import GRAINS, WOULD_BE, Piece, epoch_seconds, pieces
from core.domain.clock import isoformat
from core.domain.modes import ALLOWED, DENIED, ERROR, ESCALATED
from core.store.audit import Filters
from core.store.auditcounts import signatures
from core.store.auditstats import bounds
from core.store.models import WOULD_CHANGED, AuditCount, AuditEntry, AuditTally, Policy
from core.store.policies import get_policy

#: the range a report covers when it is not given: the 7 days before ``to``
DEFAULT_DAYS = 7
#: the most sample entry ids a report holds
SAMPLES = 20

#: how many entries share a would-be outcome: (tool, the policy that made the would-be
#: decision or "" for none, the real result, the would-be result)
Outcome = tuple[str, str, str, str]


@dataclass(frozen=True)
class Report:
    """``GET /v1/policies/:id/shadow-report``'s answer."""

    policy_id: str
    mode: str
    start: datetime
    end: datetime  # inclusive
    calls: int
    changed: int
    would_deny: int
    would_escalate: int
    would_allow: int
    errors: int
    #: (tool, calls, changed), most calls first
    by_tool: tuple[tuple[str, int, int], ...]
    samples: tuple[str, ...]

    def as_json(self) -> dict[str, object]:
        return {
            "policyId": self.policy_id,
            "mode": self.mode,
            "from": isoformat(self.start),
            "to": isoformat(self.end),
            "calls": self.calls,
            "changed": self.changed,
            "wouldDeny": self.would_deny,
            "wouldEscalate": self.would_escalate,
            "wouldAllow": self.would_allow,
            "errors": self.errors,
            "byTool": [
                {"toolName": tool, "calls": calls, "changed": changed}
                for tool, calls, changed in self.by_tool
            ],
            "samples": list(self.samples),
        }


def report(
    session: Session, workspace_id: str, policy_id: str, start: datetime, end: datetime
) -> Report:
    """The report of the workspace's policy over ``[start, end]`` (PolicyNotFound for an
    unknown one, or one of another workspace): over the entries of the policy's agent, those
    with a would-be decision (``calls``), those whose would-be decision this policy made and
    whose result differs from the real one (``changed``, split by the would-be result), those
    whose would-be decision failed (``errors``), by tool, and the newest changed entries."""
    policy = get_policy(session, workspace_id, policy_id)
    low, high = bounds(Filters(since=start, until=end))  # [low, high), None: no bound
    outcomes = counts(session, workspace_id, policy.agent_id, low, high)
    changed: Counter[str] = Counter()
    tools: dict[str, list[int]] = {}
    errors = 0
    for (tool, by, result, would), n in outcomes.items():
        mine = by == policy.id and would != result and would != ERROR
        counted = tools.setdefault(tool, [0, 0])
        counted[0] += n
        if mine:
            changed[would] += n
            counted[1] += n
        if would == ERROR:
            errors += n
    by_tool = sorted(((t, c[0], c[1]) for t, c in tools.items()), key=lambda t: (-t[1], t[0]))
    return Report(
        policy.id,
        policy.mode,
        start,
        end,
        calls=sum(outcomes.values()),
        changed=sum(changed.values()),
        would_deny=changed[DENIED],
        would_escalate=changed[ESCALATED],
        would_allow=changed[ALLOWED],
        errors=errors,
        by_tool=tuple(by_tool),
        samples=tuple(_samples(session, workspace_id, policy, low, high)),
    )


def counts(
    session: Session,
    workspace_id: str,
    agent_id: str,
    start: datetime | None,
    end: datetime | None,
) -> Counter[Outcome]:
    """How many of the agent's entries of ``[start, end)`` (None: the log's beginning or end)
    with a would-be decision share each :data:`Outcome`, exactly."""
    found: Counter[Outcome] = Counter()
    parts = pieces(start, end, GRAINS)
    whole = [part for part in parts if part.grain is not None]
    for part in whole:
        found.update(_rollups(session, workspace_id, agent_id, part))
    found.update(_tallies(session, workspace_id, agent_id, whole))
    for part in parts:
        if part.grain is None:
            found.update(_entries(session, workspace_id, agent_id, part))
    return +found


def _rollups(session: Session, workspace_id: str, agent_id: str, part: Piece) -> Counter[Outcome]:
    table = AuditCount
    query = (
        select(table.tool_name, table.session_id, table.result, table.action, func.sum(table.count))
        .where(
            table.workspace_id == workspace_id,
            table.grain == part.grain,
            table.kind == WOULD_BE,
            table.agent_id == agent_id,
            *_bucket_bounds(part),
        )
        .group_by(table.tool_name, table.session_id, table.result, table.action)
    )
    return Counter({(r[0], r[1], r[2], r[3]): int(r[4]) for r in session.execute(query) if r[4]})


def _bucket_bounds(part: Piece) -> list[ColumnElement[bool]]:
    bounds: list[ColumnElement[bool]] = []
    if part.start is not None:
        bounds.append(AuditCount.bucket >= epoch_seconds(part.start))
    if part.end is not None:
        bounds.append(AuditCount.bucket < epoch_seconds(part.end))
    return bounds


def _tallies(
    session: Session, workspace_id: str, agent_id: str, parts: list[Piece]
) -> Counter[Outcome]:
    """The tallies not yet folded, in the whole buckets of ``parts``."""
    spans = [
        (
            None if part.start is None else epoch_seconds(part.start),
            None if part.end is None else epoch_seconds(part.end),
        )
        for part in parts
    ]
    found: Counter[Outcome] = Counter()
    texts = session.scalars(
        select(AuditTally.counts).where(AuditTally.workspace_id == workspace_id)
    )
    for counts_text in texts:
        for signature, n in signatures(counts_text):
            agent, tool, _, result, _, minute, by, would = signature
            if agent != agent_id or would is None:
                continue
            if any((low is None or minute >= low) and (high is None or minute < high)
                   for low, high in spans):  # fmt: skip
                found[tool, by, result, would] += n
    return found


def _entries(session: Session, workspace_id: str, agent_id: str, part: Piece) -> Counter[Outcome]:
    """The agent's entries of a partial minute, counted themselves (its index by time)."""
    entry = AuditEntry
    where = [
        entry.workspace_id == workspace_id,
        entry.agent_id == agent_id,
        entry.erased.is_(False),
        entry.would_result.is_not(None),
    ]
    if part.start is not None:
        where.append(entry.timestamp >= part.start)
    if part.end is not None:
        where.append(entry.timestamp < part.end)
    by = func.coalesce(entry.would_policy_id, "")
    query = (
        select(entry.tool_name, by, entry.result, entry.would_result, func.count())
        .where(*where)
        .group_by(entry.tool_name, by, entry.result, entry.would_result)
    )
    return Counter({(r[0], r[1], r[2], str(r[3])): int(r[4]) for r in session.execute(query)})


def _samples(
    session: Session,
    workspace_id: str,
    policy: Policy,
    start: datetime | None,
    end: datetime | None,
) -> list[str]:
    """The ids of the newest entries (by seq) of ``[start, end)`` whose would-be decision the
    policy made and changed: through the index of such entries alone."""
    where: list[ColumnElement[bool]] = [
        AuditEntry.workspace_id == workspace_id,
        AuditEntry.would_policy_id == policy.id,
        # the index's own condition, as written there, so that the planner uses it
        text(WOULD_CHANGED),  # type: ignore[list-item]  # a condition, as SQL text
    ]
    if start is not None:
        where.append(AuditEntry.timestamp >= start)
    if end is not None:
        where.append(AuditEntry.timestamp < end)
    query = select(AuditEntry.id).where(*where).order_by(AuditEntry.seq.desc()).limit(SAMPLES)
    return list(session.scalars(query))
