"""Reading a workspace's audit chain back (decisions §7): its head, a signed checkpoint of it,
every entry in ``seq`` order as the JSONL export writes it (erased ones as placeholders), and
verification against the database. The chain is written by ``core.hotpath.chain``; the
arithmetic is ``core.domain.auditchain``. Called by ``api/audit_logs.py`` and ``api/cli.py``.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, TypeVar

import orjson
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import Text, cast, func, select, type_coerce
from sqlalchemy.orm import Session

from core.config import Settings
from core.domain.auditchain import (
    ZERO_HASH,
    ChainReport,
    Checkpoint,
    Finding,
    Run,
    Start,
    Stopped,
    chain_runs,
    check_run,
    origin_of,
    sign_note,
    verify_chain,
)
from core.domain.clock import isoformat
from core.store import audit
from core.store.database import Database
from core.store.models import AuditEntry, AuditHead

T = TypeVar("T")
_READ_BATCH = 2000
#: 20 digits in a row: maybe an integer beyond 64 bits (see _json)
_LONG_NUMBER = re.compile(r"[0-9]{20}")
_COLUMNS = (
    AuditEntry.id,
    AuditEntry.agent_id,
    AuditEntry.action,
    AuditEntry.tool_name,
    # as the driver answers them (JSON text, SQLite's timestamp text): read fast below
    type_coerce(AuditEntry.parameters, Text),
    AuditEntry.result,
    AuditEntry.policy_id,
    AuditEntry.rule_index,
    AuditEntry.reason,
    AuditEntry.latency_ms,
    type_coerce(AuditEntry.timestamp, Text),
    AuditEntry.approval_id,
    AuditEntry.session_id,
    AuditEntry.seq,
    AuditEntry.entry_hash,
    AuditEntry.hash,
    AuditEntry.erased,
    AuditEntry.hash_version,
    AuditEntry.would_result,
    AuditEntry.would_policy_id,
    AuditEntry.would_rule_index,
    AuditEntry.would_reason,
)
#: PostgreSQL's driver would read JSONB with the standard library's JSON reader and the
#: timestamp into a datetime, to be formatted again: twice the cost of the rest of reading a
#: row. Asked as SQLite's text instead (the column holds UTC without a zone), both are read
#: as fast as SQLite's
_PG_COLUMNS = tuple(
    {
        4: type_coerce(cast(AuditEntry.parameters, Text), Text),
        10: type_coerce(func.to_char(AuditEntry.timestamp, "YYYY-MM-DD HH24:MI:SS.US"), Text),
    }.get(n, column)
    for n, column in enumerate(_COLUMNS)
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
    session: Session,
    workspace_id: str,
    seq_from: int | None = None,
    seq_to: int | None = None,
    filters: audit.Filters | None = None,
) -> Iterator[dict[str, Any]]:
    """Every entry of the range in ``seq`` order, as the export writes it: the API's rendering
    with ``seq`` and ``hash``, or ``{seq, entryHash, hash, erased: true}``. ``filters`` that
    look at content narrow it to the entries that match (erased ones never do)."""
    filters = replace(filters or audit.Filters(), seq_from=seq_from, seq_to=seq_to)
    columns = _COLUMNS if session.get_bind().dialect.name == "sqlite" else _PG_COLUMNS
    query = select(*columns).where(AuditEntry.workspace_id == workspace_id)
    query = query.where(*audit.clauses(filters))
    if filters.by_content:
        query = query.where(AuditEntry.erased.is_(False))
    query = query.order_by(AuditEntry.seq).execution_options(yield_per=_READ_BATCH)
    # on the session's connection, not through the session: the ORM's result machinery costs
    # as much a row as the rest of reading it (3.5 against 1.8 µs on SQLite), and these are
    # plain columns
    for (
        id_, agent_id, action, tool_name, parameters, result, policy_id, rule_index, reason,
        latency_ms, timestamp, approval_id, session_id, seq, entry_hash, hash_, erased,
        hash_version, would_result, would_policy_id, would_rule_index, would_reason,
    ) in session.connection().execute(query):  # fmt: skip
        if erased:
            yield {"seq": seq, "entryHash": entry_hash, "hash": hash_, "erased": True}
            continue
        # audit.render_row's rendering (a test holds the two together), without a call a field
        yield {
            "id": id_,
            "agentId": agent_id,
            "action": action,
            "toolName": tool_name,
            "parameters": _json(parameters) if type(parameters) is str else parameters,
            "result": result,
            "policyId": policy_id,
            "ruleIndex": rule_index,
            "reason": reason,
            "latencyMs": latency_ms,
            "timestamp": _instant(timestamp),
            "approvalId": approval_id,
            "sessionId": session_id,
            "hashVersion": hash_version,
            "wouldBe": None
            if would_result is None
            else {
                "result": would_result,
                "policyId": would_policy_id,
                "ruleIndex": would_rule_index,
                "reason": would_reason,
            },
            "seq": seq,
            "hash": hash_,
        }


def _json(text: str) -> Any:
    """SQLite's JSON text as the API reads it. orjson reads an integer beyond 64 bits as a
    float, where the API (the standard library) keeps it whole: such text is read as the API
    reads it, so that the export says what the API says (and what PostgreSQL's JSONB gives)."""
    if _LONG_NUMBER.search(text) is None:
        return orjson.loads(text)
    return json.loads(text)


def _instant(value: Any) -> str:
    """A stored timestamp as the API renders it: SQLite's text (``2026-11-25 10:00:00.123456``,
    always with microseconds) rearranged, PostgreSQL's datetime formatted."""
    if type(value) is str and len(value) == 26 and value[10] == " ":
        return f"{value[:10]}T{value[11:]}Z"
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(value)
    return isoformat(moment.replace(tzinfo=UTC))


def jsonl(lines: Iterable[dict[str, Any]], chunk: int = 500) -> Iterator[bytes]:
    """JSON Lines, ``chunk`` lines at a time."""
    buffer: list[bytes] = []
    for line in lines:
        buffer.append(_json_line(line))
        if len(buffer) >= chunk:
            yield b"\n".join(buffer) + b"\n"
            buffer.clear()
    if buffer:
        yield b"\n".join(buffer) + b"\n"


def _json_line(line: dict[str, Any]) -> bytes:
    """One line of the export. orjson writes no integer beyond 64 bits, which a caller's
    parameters may hold (the API took and stored it): such a line is written by the standard
    library, exactly, as the API's other answers write it, rather than failing the export
    midway (a client would keep a log cut short that verifies as far as it goes)."""
    try:
        return orjson.dumps(line)
    except orjson.JSONEncodeError:
        return json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode()


def verify(
    session: Session,
    workspace_id: str,
    checkpoints: Iterable[Checkpoint] = (),
    *,
    url: str | None = None,
) -> ChainReport:
    """The workspace's chain in the database, verified from seq 1 (or from its pruned head,
    decisions §9: the entries before it are in archives) against ``checkpoints`` and
    against its own head row (so that a log cut short, or one entry too long, is named even
    without a checkpoint). Run it in a snapshot transaction: entries committed meanwhile would
    otherwise run past the head read.

    Entries are hashed in runs, by worker processes reading ranges of seq on connections of
    their own when ``url`` (the database's) is given and the log is long; this process chains
    the runs, and where something does not hold, reads on from a few entries before it to name
    what."""
    checkpoints = list(checkpoints)
    pruned = session.execute(
        select(AuditHead.pruned_seq, AuditHead.pruned_hash).where(
            AuditHead.workspace_id == workspace_id
        )
    ).first()
    start = Start() if pruned is None else Start(int(pruned[0]), bytes.fromhex(pruned[1]))
    last = (
        session.scalar(
            select(func.max(AuditEntry.seq)).where(AuditEntry.workspace_id == workspace_id)
        )
        or 0
    )
    # up to ``last`` and no further: the workers read on connections of their own, outside
    # this snapshot, and must not run into entries committed since (the head read here would
    # then call them inserted)
    marks = frozenset(c.size for c in checkpoints)
    ranges = [
        (url or "", workspace_id, low, min(low + _RANGE - 1, last), marks)
        for low in range(start.size + 1, last + 1, _RANGE)
    ]
    if url is not None:
        runs: Iterable[Run] = parallel(_check_range, ranges, last)
    else:
        runs = (check_run(entries(session, workspace_id, r[2], r[3]), marks) for r in ranges)
    found = chain_runs(runs, checkpoints, start)
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


def parallel(function: Callable[[T], Run], items: Iterable[T], size: int) -> Iterator[Run]:
    """``map(function, items)`` in order; in worker processes when ``size`` (how many entries
    the items hold) makes it worth starting them, a bounded number of items in flight."""
    workers = os.cpu_count() or 1
    if size < PARALLEL_FROM or workers < 2:
        yield from map(function, items)
        return
    # forked, where the platform can: a worker then starts with everything imported (spawned,
    # each would import it all again, a second and more here). This process has no thread
    # yet (the pool launches its workers before its own), and a worker never touches this
    # process's connections: it opens its own, and leaves with os._exit like every pool worker
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        pending: deque[Future[Run]] = deque()
        for item in items:
            pending.append(pool.submit(function, item))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


#: a worker's databases, by process and URL: a worker forked from a process that has read
#: ranges itself (a short log verified earlier) must not use that process's connections
_DATABASES: dict[tuple[int, str], Database] = {}


def _check_range(item: tuple[str, str, int, int, frozenset[int]]) -> Run:
    """In a worker: the entries of one seq range, read on a connection of its own, checked."""
    url, workspace_id, low, high, marks = item
    database = _DATABASES.get((os.getpid(), url))
    if database is None:
        database = _DATABASES[os.getpid(), url] = Database(Settings(database_url=url))
    with database.transaction() as session:
        return check_run(entries(session, workspace_id, low, high), marks)
