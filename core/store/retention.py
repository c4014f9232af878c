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
4. :func:`remove`: the entries deleted a batch a transaction (each batch takes its counts
   back with it), until none is left at or before the pruned head.

A run first completes the removal a stopped run left, so nothing recorded as pruned stays,
and never removes an entry that is not in a verified archive. The steps are run, with the
prune's own audit entry, by ``api/retention.py`` (``agentauth audit prune`` and the retention
of ``agentauth serve``).
"""

from __future__ import annotations

import gzip
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import delete, select, update
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
from core.domain.auditcounts import Signature
from core.store import audit, auditcounts, chain, parquet
from core.store.database import Database
from core.store.models import AuditEntry, AuditHead

#: entries one removal transaction deletes: a short hold of SQLite's write lock
REMOVE_BATCH = 2000


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
    with db.transaction(snapshot=True) as session, partial.open("wb") as raw:
        with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as out:
            lines = chain.entries(session, taken.workspace_id, taken.first, taken.last)
            for chunk in chain.jsonl(lines):
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
    """Delete the entries at or before the pruned head, a batch a transaction, each batch's
    counts taken back with it; how many."""
    removed = 0
    while True:
        with db.transaction(write=True) as session:
            seq, _ = pruned_head(session, workspace_id)
            rows = session.execute(
                select(
                    AuditEntry.seq, AuditEntry.erased, AuditEntry.agent_id, AuditEntry.tool_name,
                    AuditEntry.session_id, AuditEntry.result, AuditEntry.action,
                    AuditEntry.timestamp,
                )
                .where(AuditEntry.workspace_id == workspace_id, AuditEntry.seq <= seq)
                .order_by(AuditEntry.seq)
                .limit(REMOVE_BATCH)
            ).all()  # fmt: skip
            if not rows:
                return removed
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
            removed += len(rows)
