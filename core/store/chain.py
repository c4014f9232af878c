"""Reading a workspace's audit chain back (decisions §7): its head, a signed checkpoint of it,
every entry in ``seq`` order as the JSONL export writes it (erased ones as placeholders), and
verification against the database. The chain is written by ``core.hotpath.chain``; the
arithmetic is ``core.domain.auditchain``. Called by ``api/audit_logs.py`` and ``api/cli.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any

import orjson
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.domain.auditchain import (
    ZERO_HASH,
    ChainReport,
    Checkpoint,
    Finding,
    origin_of,
    sign_note,
    verify_chain,
)
from core.store.audit import render_row
from core.store.models import AuditEntry, AuditHead

_READ_BATCH = 2000
_COLUMNS = (
    AuditEntry.id,
    AuditEntry.seq,
    AuditEntry.agent_id,
    AuditEntry.action,
    AuditEntry.tool_name,
    AuditEntry.parameters,
    AuditEntry.result,
    AuditEntry.policy_id,
    AuditEntry.rule_index,
    AuditEntry.approval_id,
    AuditEntry.reason,
    AuditEntry.latency_ms,
    AuditEntry.timestamp,
    AuditEntry.entry_hash,
    AuditEntry.hash,
    AuditEntry.erased,
)


def head(session: Session, workspace_id: str) -> tuple[int, bytes]:
    """The size of the workspace's chain and its newest hash (32 zero bytes when empty)."""
    row = session.execute(
        select(AuditHead.seq, AuditHead.hash).where(AuditHead.workspace_id == workspace_id)
    ).first()
    return (0, ZERO_HASH) if row is None else (int(row.seq), bytes.fromhex(row.hash))


def checkpoint(session: Session, workspace_id: str, key: Ed25519PrivateKey) -> str:
    """The chain's current head as a C2SP signed note."""
    size, newest = head(session, workspace_id)
    return sign_note(Checkpoint(origin_of(workspace_id), size, newest).text(), key)


def entries(
    session: Session, workspace_id: str, seq_from: int | None = None, seq_to: int | None = None
) -> Iterator[dict[str, Any]]:
    """Every entry of the range in ``seq`` order, as the export writes it: the API's rendering
    with ``seq`` and ``hash``, or ``{seq, entryHash, hash, erased: true}``."""
    query = select(*_COLUMNS).where(AuditEntry.workspace_id == workspace_id)
    if seq_from is not None:
        query = query.where(AuditEntry.seq >= seq_from)
    if seq_to is not None:
        query = query.where(AuditEntry.seq <= seq_to)
    query = query.order_by(AuditEntry.seq).execution_options(yield_per=_READ_BATCH)
    for row in session.execute(query):
        if row.erased:
            yield {"seq": row.seq, "entryHash": row.entry_hash, "hash": row.hash, "erased": True}
        else:
            line = render_row(row._mapping.__getitem__)
            line["seq"] = row.seq
            line["hash"] = row.hash
            yield line


def jsonl(lines: Iterable[dict[str, Any]], chunk: int = 500) -> Iterator[bytes]:
    """JSON Lines, ``chunk`` lines at a time."""
    buffer: list[bytes] = []
    for line in lines:
        buffer.append(orjson.dumps(line))
        if len(buffer) >= chunk:
            yield b"\n".join(buffer) + b"\n"
            buffer.clear()
    if buffer:
        yield b"\n".join(buffer) + b"\n"


def verify(
    session: Session, workspace_id: str, checkpoints: Iterable[Checkpoint] = ()
) -> ChainReport:
    """The workspace's chain in the database, verified from seq 1 against ``checkpoints`` and
    against its own head row (so that a log cut short, or one entry too long, is named even
    without a checkpoint). Run it in a snapshot transaction: entries committed meanwhile would
    otherwise run past the head read."""
    report = verify_chain(entries(session, workspace_id), list(checkpoints))
    size, newest = head(session, workspace_id)
    if not report.ok or (report.size, report.head) == (size, newest):
        return report
    if report.size < size:
        finding = Finding(
            report.size + 1, "missing", f"the log ends at {report.size}, its head is at {size}"
        )
    elif report.size > size:
        finding = Finding(size + 1, "inserted", f"the log runs past its head at {size}")
    else:
        finding = Finding(size, "changed", f"entry {size} does not chain to the head written")
    return replace(report, failure=finding)
