"""Reading a workspace's audit chain back (decisions §7): its head, a signed checkpoint of it,
every entry in ``seq`` order as the JSONL export writes it (erased ones as placeholders), and
verification against the database. The chain is written by ``core.hotpath.chain``; the
arithmetic is ``core.domain.auditchain``. Called by ``api/audit_logs.py`` and ``api/cli.py``.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import replace
from typing import Any, TypeVar

import orjson
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from core.config import Settings
from core.domain.auditchain import (
    ZERO_HASH,
    ChainReport,
    Checkpoint,
    Finding,
    Hashed,
    Stopped,
    chain_runs,
    hash_entries,
    origin_of,
    sign_note,
    verify_chain,
)
from core.store.audit import render_row
from core.store.database import Database
from core.store.models import AuditEntry, AuditHead

T = TypeVar("T")
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
    session: Session,
    workspace_id: str,
    checkpoints: Iterable[Checkpoint] = (),
    *,
    url: str | None = None,
) -> ChainReport:
    """The workspace's chain in the database, verified from seq 1 against ``checkpoints`` and
    against its own head row (so that a log cut short, or one entry too long, is named even
    without a checkpoint). Run it in a snapshot transaction: entries committed meanwhile would
    otherwise run past the head read.

    Entries are hashed in runs, by worker processes reading ranges of seq on connections of
    their own when ``url`` (the database's) is given and the log is long; this process chains
    the runs, and where something does not hold, reads on from a few entries before it to name
    what."""
    checkpoints = list(checkpoints)
    last = session.scalar(
        select(func.max(AuditEntry.seq)).where(AuditEntry.workspace_id == workspace_id)
    )
    ranges = [
        (url or "", workspace_id, low, low + _RANGE - 1)
        for low in range(1, (last or 0) + 1, _RANGE)
    ]
    if url is not None:
        runs: Iterable[Hashed] = parallel(_hash_range, ranges, last or 0)
    else:
        runs = (
            hash_entries(entries(session, workspace_id, low, high)) for _, _, low, high in ranges
        )
    found = chain_runs(runs, checkpoints)
    if isinstance(found, Stopped):
        rest = entries(session, workspace_id, seq_from=found.start.size + 1)
        found = verify_chain(rest, checkpoints, start=found.start)
    return _against_head(session, workspace_id, found)


def _against_head(session: Session, workspace_id: str, report: ChainReport) -> ChainReport:
    """``report``, failed when the log disagrees with the head row, or holds entries that are
    not in the chain at all (no seq: they would show in the list, not in the export)."""
    size, newest = head(session, workspace_id)
    outside = session.scalar(
        select(func.count())
        .select_from(AuditEntry)
        .where(AuditEntry.workspace_id == workspace_id, AuditEntry.seq.is_(None))
    )
    if report.ok and outside:
        detail = f"{outside} entries have no place in the chain (no seq)"
        return replace(report, failure=Finding(0, "inserted", detail))
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


# ------------------------------------------------------------- verifying a large log, fast

#: a log this long is hashed by worker processes, one per core (fewer: starting them costs more)
PARALLEL_FROM = 50_000
_RANGE = 5000


def parallel(function: Callable[[T], Hashed], items: Iterable[T], size: int) -> Iterator[Hashed]:
    """``map(function, items)`` in order; in worker processes when ``size`` (how many entries
    the items hold) makes it worth starting them, a bounded number of items in flight."""
    workers = os.cpu_count() or 1
    if size < PARALLEL_FROM or workers < 2:
        yield from map(function, items)
        return
    context = multiprocessing.get_context("spawn")  # nothing of this process's connections
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        pending: deque[Future[Hashed]] = deque()
        for item in items:
            pending.append(pool.submit(function, item))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


_DATABASES: dict[str, Database] = {}


def _hash_range(item: tuple[str, str, int, int]) -> Hashed:
    """In a worker: the entries of one seq range, read on a connection of its own, hashed."""
    url, workspace_id, low, high = item
    database = _DATABASES.get(url)
    if database is None:
        database = _DATABASES[url] = Database(Settings(database_url=url))
    with database.transaction() as session:
        return hash_entries(entries(session, workspace_id, low, high))
