"""Retention by archive-then-prune (decisions §9): a workspace's oldest entries, up to the
newest whose timestamp is before a cut, written to a gzip-compressed JSONL archive in the
export's form with a signed checkpoint beside it, read back and verified, and only then
removed from the database. Each step leaves a state the next run completes:

1. :func:`write_archive`: the archive and its checkpoint, each written to a temporary name,
   synced and renamed (a stop leaves at most a ``.partial`` file, written anew next time);
2. :func:`verify_archive`: the file read back, its chain recomputed from the head of the
   archive before it, held against the checkpoint; then, when asked, :func:`write_parquet`
   its Parquet form beside it, in the same way;
3. :func:`record`: the pruned head (the range's last seq and hash) stored, in one transaction:
   from here on the database lets exactly these entries be deleted, verification starts at
   this head, and the list and totals leave them out;
4. :func:`remove`: the entries deleted until none is left at or before the pruned head:
   whole day partitions dropped (PostgreSQL), then whole hours (their counts deleted at once),
   then the rest a batch a transaction, each owing its counts back as a tally.

A run first completes the removal a stopped run left, so nothing recorded as pruned stays,
and never removes an entry that is not in a verified archive. The steps are run, with the
prune's own audit entry, by ``api/retention.py`` (``agentauth audit prune`` and the retention
of ``agentauth serve``).
"""

from __future__ import annotations

import gzip
import os
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from core.domain.auditchain import (
    ChainReport,
    Checkpoint,
    Finding,
    Start,
    origin_of,
    sign_note,
    verify_chain,
)
from core.domain.auditcounts import HOUR, Signature, epoch_seconds, floor_to
from core.store import audit, auditcounts, auditstats, chain, paced, parquet, partitions
from core.store.database import Database
from core.store.models import AuditEntry, AuditHead

#: how many entries of an archive are read a transaction (a second or so of reading)
ARCHIVE_BITE = 50_000
#: the tool name and action of a prune's own audit entry
PRUNE = "audit.prune"
#: how long the removal pauses on SQLite after each batch, in multiples of how long the batch
#: held the write lock: nobody waits to see a prune finish, and decisions get three quarters
#: of the lock (a day of 1 M entries at 100 decisions a second, 2 cores: authorize p99 during
#: the removal 10.9 ms median, 60 of 70 runs within twice idle, against 13.2-15.5 ms with
#: pauses as long as the batches, which removed three to four times as fast)
REST = 3.0


@dataclass(frozen=True)
class Plan:
    """What a prune takes: the entries ``first`` to ``last`` of the workspace's chain."""

    workspace_id: str
    first: int
    last: int
    #: the head the range's chain starts from: the pruned head before it (zeros at seq 0)
    start_hash: bytes

    @property
    def count(self) -> int:
        return self.last - self.first + 1


def pruned_head(session: Session, workspace_id: str) -> tuple[int, bytes]:
    """Where the workspace's chain was pruned: ``(seq, hash of that entry)``, (0, zeros)."""
    row = session.execute(
        select(AuditHead.pruned_seq, AuditHead.pruned_hash).where(
            AuditHead.workspace_id == workspace_id
        )
    ).first()
    return (0, bytes(32)) if row is None else (int(row[0]), bytes.fromhex(row[1]))


@dataclass(frozen=True)
class LastPrune:
    """A prune as its own audit entry records it: the range it took, its archive, when."""

    seq: int
    at: datetime
    first: int
    last: int
    archive: str
    reason: str


@dataclass(frozen=True)
class Kept:
    """What a workspace's log keeps now (``GET /v1/audit-logs/retention``)."""

    #: the entries the list holds: neither pruned nor erased
    kept: int
    #: the whole log's size, pruned entries included: the head's seq
    size: int
    #: the entries 1 to this were archived and pruned (0: never)
    pruned_through: int
    #: the oldest entry still in the database (an erased one keeps its place): seq, timestamp
    oldest: tuple[int, datetime] | None
    last_prune: LastPrune | None


def kept(session: Session, workspace_id: str) -> Kept:
    """What the log keeps, read by index lookups and the kept counts (never a count of rows)."""
    pruned, _ = pruned_head(session, workspace_id)
    size, _ = chain.head(session, workspace_id)
    # min(), then the row of that seq: on a partitioned log (PostgreSQL) each day's index
    # answers its own least seq, where an ORDER BY may sort them all
    first = session.scalar(
        select(func.min(AuditEntry.seq)).where(
            AuditEntry.workspace_id == workspace_id, AuditEntry.seq > pruned
        )
    )
    oldest = None
    if first is not None:
        oldest = session.execute(
            select(AuditEntry.seq, AuditEntry.timestamp).where(
                AuditEntry.workspace_id == workspace_id, AuditEntry.seq == first
            )
        ).first()
    return Kept(
        kept=auditstats.count(session, workspace_id, audit.Filters()),
        size=size,
        pruned_through=pruned,
        oldest=None if oldest is None else (int(oldest.seq), oldest.timestamp),
        last_prune=last_prune(session, workspace_id),
    )


def last_prune(session: Session, workspace_id: str) -> LastPrune | None:
    """The newest prune's audit entry, by the workspace's tool and time index."""
    entry = session.scalars(
        select(AuditEntry)
        .where(
            AuditEntry.workspace_id == workspace_id,
            AuditEntry.tool_name == PRUNE,
            AuditEntry.action == PRUNE,  # an agent's call of a tool so named is "authorize"
        )
        .order_by(AuditEntry.timestamp.desc(), AuditEntry.id.desc())
        .limit(1)
    ).first()
    if entry is None:
        return None
    taken = entry.parameters
    return LastPrune(
        int(entry.seq), entry.timestamp, taken["first"], taken["last"], taken["archive"],
        entry.reason,
    )  # fmt: skip


def plan(session: Session, workspace_id: str, before: datetime) -> Plan | None:
    """The entries a prune at ``before`` takes (None: none): from the last pruned one on, up
    to the newest whose timestamp is before ``before``."""
    seq, head = pruned_head(session, workspace_id)
    newest = session.scalar(
        select(AuditEntry.seq)
        .where(AuditEntry.workspace_id == workspace_id, AuditEntry.timestamp < before)
        .order_by(AuditEntry.timestamp.desc(), AuditEntry.id.desc())
        .limit(1)
    )
    if newest is None or newest <= seq:
        return None
    return Plan(workspace_id, seq + 1, int(newest), head)


def archive_paths(folder: Path, name: str, taken: Plan) -> tuple[Path, Path]:
    """``<NAME>-<first>-<last>.jsonl.gz`` and its ``.checkpoint`` in ``folder``."""
    stem = f"{name}-{taken.first}-{taken.last}"
    return folder / f"{stem}.jsonl.gz", folder / f"{stem}.checkpoint"


def write_archive(
    db: Database, taken: Plan, folder: Path, name: str, key: Ed25519PrivateKey
) -> tuple[Path, Path]:
    """The archive of ``taken`` and its checkpoint at size ``last``, each synced and renamed
    into place; their paths."""
    archive, note = archive_paths(folder, name, taken)
    folder.mkdir(parents=True, exist_ok=True)
    head = b""
    partial = archive.with_name(archive.name + ".partial")
    with partial.open("wb") as raw:
        with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as out:
            for chunk in chain.jsonl(_in_bites(db, taken)):
                out.write(chunk)
                head = chunk  # the last chunk ends with the range's last line
        raw.flush()
        os.fsync(raw.fileno())
    last_line = orjson.loads(head.rstrip(b"\n").rsplit(b"\n", 1)[-1]) if head else {}
    if last_line.get("seq") != taken.last:
        partial.unlink(missing_ok=True)
        raise ArchiveError(f"the log does not hold entries {taken.first} to {taken.last}")
    text = Checkpoint(origin_of(taken.workspace_id), taken.last, bytes.fromhex(last_line["hash"]))
    _replace(partial, archive)
    signed = note.with_name(note.name + ".partial")
    with signed.open("w", encoding="utf-8") as file:
        file.write(sign_note(text.text(), key))
        file.flush()
        os.fsync(file.fileno())
    _replace(signed, note)
    return archive, note


def _in_bites(db: Database, taken: Plan) -> Iterator[dict[str, Any]]:
    """The entries of ``taken`` in seq order, :data:`ARCHIVE_BITE` of them a transaction. One
    read held open over millions of entries would keep SQLite from checkpointing its WAL past
    it for minutes: the WAL would grow with every decision meanwhile, and the first checkpoint
    after it, run by a decision's commit, would copy all of it. (An entry erased between two
    bites is archived as erased or not; either verifies.)"""
    for low in range(taken.first, taken.last + 1, ARCHIVE_BITE):
        high = min(low + ARCHIVE_BITE - 1, taken.last)
        with db.transaction(snapshot=True) as session:
            yield from chain.entries(session, taken.workspace_id, low, high)


def write_parquet(archive: Path) -> Path:
    """The Parquet form of a verified ``archive`` beside it (same name, ``.parquet``), read
    from that archive so the two hold the same entries; written to a temporary name, synced
    and renamed into place. Its path."""
    final = archive.with_name(archive.name.removesuffix(".jsonl.gz") + ".parquet")
    partial = final.with_name(final.name + ".partial")
    with partial.open("wb") as file:
        parquet.write(read_archive(archive), file)
        file.flush()
        os.fsync(file.fileno())
    _replace(partial, final)
    return final


def _replace(partial: Path, final: Path) -> None:
    os.replace(partial, final)
    folder = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(folder)  # the rename itself survives a power cut
    finally:
        os.close(folder)


class ArchiveError(Exception):
    """An archive could not be written or does not verify: nothing was removed."""


def read_archive(path: Path) -> Iterator[dict[str, Any]]:
    """The lines of a gzip-compressed (``.gz``) or plain JSONL export or archive."""
    opener: Any = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as file:
        for line in file:
            if line.strip():
                yield orjson.loads(line)


def verify_archive(path: Path, checkpoint: Checkpoint, taken: Plan) -> ChainReport:
    """The archive read back: every entry's hash and the chain from ``taken``'s start,
    ending at ``taken.last`` with the checkpoint's head."""
    start = Start(taken.first - 1, taken.start_hash)
    try:
        report = verify_chain(read_archive(path), [checkpoint], start=start)
    except (OSError, EOFError, orjson.JSONDecodeError) as exc:
        return ChainReport(0, 0, 0, b"", 0, Finding(taken.first, "malformed", str(exc)))
    if report.ok and report.size != taken.last:
        detail = f"the archive ends at {report.size}, not {taken.last}"
        return ChainReport(0, 0, 0, b"", 0, Finding(report.size + 1, "missing", detail))
    return report


def record(session: Session, taken: Plan, head: bytes) -> None:
    """The pruned head moved to ``taken.last`` (never back)."""
    session.execute(
        update(AuditHead)
        .where(AuditHead.workspace_id == taken.workspace_id, AuditHead.pruned_seq < taken.last)
        .values(pruned_seq=taken.last, pruned_hash=head.hex())
    )


def remove(db: Database, workspace_id: str) -> int:
    """Delete the entries at or before the pruned head; how many. Where the log is partitioned
    (PostgreSQL), the days wholly pruned go first, a partition dropped a transaction; then
    each hour wholly pruned, its counts deleted at once and its entries a batch a transaction;
    then what is left (the hour the kept entries begin in), each batch taking its entries'
    counts back one by one. On SQLite the space a batch held goes back to the file, and each
    batch is followed by a pause as long as it took, so decisions never wait behind more than
    one."""
    removed = _drop_days(db, workspace_id)
    removed += _remove_hours(db, workspace_id)
    removed += _remove_rest(db, workspace_id)
    if db.is_sqlite and removed:  # what the last batches freed, a step and a pause at a time
        while (held := paced.give_back(db)) is not None:
            time.sleep(REST * held)
    return removed


def _remove_hours(db: Database, workspace_id: str) -> int:
    """The oldest hours in which every entry of the workspace is pruned, one after the other;
    how many entries they held."""
    removed = 0
    # kept from hour to hour: each finds its size once
    pace, counts = paced.Pace(db, rest=REST), paced.Pace(db, rest=REST)
    while True:
        with db.transaction(snapshot=True) as session:
            hour = _pruned_hour(session, workspace_id)
        if hour is None:
            return removed
        start, end = epoch_seconds(hour), epoch_seconds(hour) + HOUR
        auditcounts.drain(db)  # the hour's tallies, if any, are long due
        with db.transaction(snapshot=True) as session:
            if not auditcounts.settled(session, workspace_id, start, end):
                return removed
        removed += _remove_hour(db, workspace_id, hour, pace, counts)


def _remove_hour(
    db: Database, workspace_id: str, hour: datetime, pace: paced.Pace, counts: paced.Pace
) -> int:
    """A settled pruned hour: its rollup rows (at once on PostgreSQL, paced on SQLite), then
    its entries, a paced batch a transaction; how many entries."""
    start = epoch_seconds(hour)
    counts.run(
        lambda session, size: auditcounts.forget(
            session, workspace_id, start, start + HOUR, size if db.is_sqlite else None
        )
    )
    in_hour = (
        AuditEntry.workspace_id == workspace_id,
        AuditEntry.timestamp >= hour,
        AuditEntry.timestamp < hour + timedelta(hours=1),
    )

    # the hour's bounds outside the subquery too on PostgreSQL, so that it looks in that
    # hour's partition only; not on SQLite, which would then walk the hour's whole range of the
    # time index and test each entry against the batch's ids, in every batch (44 ms over a
    # range of 400,000 entries; 2 ms for 80 entries found by their ids)
    bounds = () if db.is_sqlite else in_hour

    def entries(session: Session, size: int) -> int:
        # one statement, on the connection (no ORM bookkeeping): a batch's fixed cost is what
        # makes a small batch dear
        taken = select(AuditEntry.id).where(*in_hour).limit(size)
        batch = delete(AuditEntry).where(*bounds, AuditEntry.id.in_(taken.scalar_subquery()))
        return int(session.connection().execute(batch).rowcount)

    return pace.run(entries)


def _pruned_hour(session: Session, workspace_id: str) -> datetime | None:
    """The hour of the workspace's oldest entry, when that entry and every other of its hour
    are at or before the pruned head (None otherwise)."""
    seq, _ = pruned_head(session, workspace_id)
    oldest = session.execute(
        select(AuditEntry.timestamp, AuditEntry.seq)
        .where(AuditEntry.workspace_id == workspace_id)
        .order_by(AuditEntry.timestamp, AuditEntry.id)
        .limit(1)
    ).first()
    if oldest is None or oldest.seq > seq:
        return None
    hour = floor_to(oldest.timestamp, HOUR)
    kept = session.scalar(
        select(AuditEntry.seq)
        .where(
            AuditEntry.workspace_id == workspace_id,
            AuditEntry.timestamp >= hour,
            AuditEntry.timestamp < hour + timedelta(hours=1),
            AuditEntry.seq > seq,
        )
        .limit(1)
    )
    return hour if kept is None else None


def _remove_rest(db: Database, workspace_id: str) -> int:
    """The pruned entries left, a batch a transaction, each batch's counts taken back."""

    def batch(session: Session, size: int) -> int:
        seq, _ = pruned_head(session, workspace_id)
        rows = session.execute(
            select(
                AuditEntry.seq, AuditEntry.erased, AuditEntry.agent_id, AuditEntry.tool_name,
                AuditEntry.session_id, AuditEntry.result, AuditEntry.action, AuditEntry.timestamp,
                AuditEntry.would_policy_id, AuditEntry.would_result,
            )
            .where(AuditEntry.workspace_id == workspace_id, AuditEntry.seq <= seq)
            .order_by(AuditEntry.seq)
            .limit(size)
        ).all()  # fmt: skip
        if not rows:
            return 0
        tally: Counter[Signature] = Counter()
        for row in rows:
            if not row.erased:  # an erased entry was taken out of the counts already
                tally[audit.signature(row._asdict())] -= 1
        session.execute(
            delete(AuditEntry).where(
                AuditEntry.workspace_id == workspace_id,
                AuditEntry.seq >= rows[0].seq,
                AuditEntry.seq <= rows[-1].seq,
            )
        )
        auditcounts.add(session, workspace_id, tally)
        return len(rows)

    return paced.Pace(db, rest=REST).run(batch)


def _drop_days(db: Database, workspace_id: str) -> int:
    """The day partitions the prune emptied of kept entries, older than the workspace's
    oldest kept entry, dropped; how many of the workspace's entries they held."""
    removed = 0
    while True:
        auditcounts.drain(db)  # the day's tallies, if any, are long due
        with db.transaction(write=True) as session:
            if not partitions.is_partitioned(session):
                return removed
            seq, _ = pruned_head(session, workspace_id)
            oldest = session.scalar(
                select(AuditEntry.timestamp).where(
                    AuditEntry.workspace_id == workspace_id, AuditEntry.seq == seq + 1
                )
            )
            days = [] if oldest is None else partitions.droppable(session, oldest)
            if not days:
                return removed
            held = partitions.drop(session, days[0])
            if held is None:
                return removed
            removed += held.get(workspace_id, 0)
