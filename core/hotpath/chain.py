"""Extending each workspace's audit chain inside the group-commit transaction (decisions §7).

A batch reads the head of every workspace it writes to (locking its row on PostgreSQL, so a
batch of another process waits for this one to commit and then extends the chain from where
this one left it), gives each audit row the next ``seq``, its ``entry_hash`` and ``hash``, and
writes the new heads before the COMMIT that makes the rows durable, with one tally a workspace
of what the rows add to the counts (``core.domain.auditcounts``: totals and stats read those,
never the rows). On SQLite the write lock that ``BEGIN IMMEDIATE`` took does the same. The
entries' canonical JSON was made before the batch (:class:`core.domain.auditchain.Leaf`):
under the lock each entry costs two SHA-256.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import BindParameter, Table, bindparam, select, update
from sqlalchemy.dialects import postgresql, sqlite

from core.domain.auditchain import ZERO_HASH, Leaf, chain_hash
from core.domain.auditcounts import Signature
from core.hotpath.sql import compile_for
from core.store import auditcounts
from core.store.models import AuditHead

_HEADS: Table = AuditHead.__table__  # type: ignore[assignment]


@dataclass(frozen=True)
class AuditRow:
    """An audit row as the driver takes it, without its three chain columns, its leaf, and
    what it says of itself for counting."""

    values: tuple[Any, ...]
    workspace_id: str
    leaf: Leaf
    signature: Signature


class ChainStatements:
    def __init__(self, dialect: Any) -> None:
        workspace: BindParameter[str] = bindparam("workspace_id")
        self.read = compile_for(
            select(_HEADS.c.seq, _HEADS.c.hash)
            .where(_HEADS.c.workspace_id == workspace)
            .with_for_update(),
            dialect,
        )
        insert = (postgresql if dialect.name == "postgresql" else sqlite).insert(_HEADS)
        self.create = compile_for(
            insert.values(
                workspace_id=workspace, seq=0, hash=ZERO_HASH.hex()
            ).on_conflict_do_nothing(index_elements=[_HEADS.c.workspace_id]),
            dialect,
        )
        self.write = compile_for(
            update(_HEADS)
            .where(_HEADS.c.workspace_id == workspace)
            .values(seq=bindparam("seq"), hash=bindparam("hash")),
            dialect,
        )
        self.tally = compile_for(auditcounts.TALLY, dialect)


Mark = tuple[dict[str, tuple[int, bytes]], dict[str, Counter[Signature]]]


class Chain:
    """The heads one transaction read and moved on; :meth:`write` stores them."""

    def __init__(self, cursor: Any, statements: ChainStatements) -> None:
        self._cursor = cursor
        self._sql = statements
        self._heads: dict[str, tuple[int, bytes]] = {}
        self._tallies: dict[str, Counter[Signature]] = {}

    def extend(self, row: AuditRow) -> tuple[Any, ...]:
        """``row``'s values with its seq, entry hash and hash, the head moved past it."""
        seq, head = self._heads.get(row.workspace_id) or self._read(row.workspace_id)
        seq += 1
        own = row.leaf.hash(seq)
        head = chain_hash(head, own)
        self._heads[row.workspace_id] = (seq, head)
        tally = self._tallies.get(row.workspace_id)
        if tally is None:
            tally = self._tallies[row.workspace_id] = Counter()
        tally[row.signature] += 1
        return (*row.values, seq, own.hex(), head.hex())

    def extend_all(self, rows: Sequence[AuditRow]) -> list[tuple[Any, ...]]:
        """What :meth:`extend` gives for each of ``rows``, in their order; the heads not read
        yet are read first, in workspace order. So every batch locks the heads it needs in one
        order, and two batches writing to the same workspaces (from two processes) never wait
        for each other in a circle: PostgreSQL would break such a deadlock by failing one of
        them, and with it the decisions in it."""
        for workspace_id in sorted({row.workspace_id for row in rows} - self._heads.keys()):
            self._read(workspace_id)
        return [self.extend(row) for row in rows]

    def mark(self) -> Mark:
        """Where the heads and counts are, for :meth:`back_to` after a savepoint is rolled
        back."""
        return dict(self._heads), {w: Counter(t) for w, t in self._tallies.items()}

    def back_to(self, mark: Mark) -> None:
        """Forget what moved since ``mark`` (the heads are written only at the end, so a head
        first read since then is read again when next needed)."""
        heads, tallies = mark
        self._heads = dict(heads)
        self._tallies = {w: Counter(t) for w, t in tallies.items()}

    def write(self) -> None:
        """The heads moved, in one order whichever the batch (so two batches of two processes
        never wait for each other's rows in a circle), and each workspace's tally."""
        for workspace_id, (seq, head) in sorted(self._heads.items()):
            values = {"workspace_id": workspace_id, "seq": seq, "hash": head.hex()}
            self._cursor.execute(self._sql.write.sql, self._sql.write.bind(values))
        for workspace_id, tally in sorted(self._tallies.items()):
            values = {"workspace_id": workspace_id, "counts": auditcounts.tally_text(tally)}
            self._cursor.execute(self._sql.tally.sql, self._sql.tally.bind(values))
        self._tallies.clear()

    def _read(self, workspace_id: str) -> tuple[int, bytes]:
        key = {"workspace_id": workspace_id}
        self._cursor.execute(self._sql.read.sql, self._sql.read.bind(key))
        row = self._cursor.fetchone()
        if row is None:  # a workspace older than its head row: its first entry creates it
            self._cursor.execute(self._sql.create.sql, self._sql.create.bind(key))
            self._cursor.execute(self._sql.read.sql, self._sql.read.bind(key))
            row = self._cursor.fetchone()
        found = (int(row[0]), bytes.fromhex(row[1]))
        self._heads[workspace_id] = found
        return found
