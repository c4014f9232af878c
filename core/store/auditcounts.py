"""The audit log's counts (decisions §9), kept: each batch of decisions writes one tally a
workspace in its transaction (``core.hotpath.chain``, with :data:`TALLY`), :func:`fold` moves
tallies into the rollup rows of ``audit_counts`` off the hot path (``agentauth serve``'s
maintenance process, every second, a bounded bite a transaction), erasure and removal take
their entries back with a tally of negative counts (:func:`add`), and a prune deletes the
rows of the hours it emptied whole (:func:`forget`). Read by ``core.store.auditstats``, which
adds the tallies not yet folded.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping
from functools import cache
from typing import Any

import orjson
from sqlalchemy import Insert, bindparam, delete, insert, literal_column, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from core.domain.auditcounts import GRAINS, KINDS, Key, Signature, keys_of
from core.store.database import Database
from core.store.models import AuditCount, AuditTally
from core.store.paced import LONGER_HOLD_SECONDS, Pace

_KEY_COLUMNS: tuple[str, ...] = ("grain", "kind", "agent_id", "tool_name", "session_id")
_KEY_COLUMNS += ("bucket", "result", "action")
#: how many distinct signatures one fold takes (about eight rollup rows each): a transaction
#: of a few milliseconds, which on SQLite holds the write lock that decisions wait for; and
#: the most tallies it reads to find them. Batches under load repeat the same few signatures
#: (the same agents and tools within a minute), so a fold takes a second of them at once: one
#: transaction, one commit a second, rather than one every few dozen batches. An erasure's or
#: a prune's tally holds up to a batch of entries' signatures, most of them distinct.
FOLD_SIGNATURES = 250
FOLD_LIMIT = 2000
#: how many tallies a fold reads at a time
FOLD_FETCH = 32
#: the recorder's statement: one batch's tally of one workspace
TALLY = insert(AuditTally).values(
    workspace_id=bindparam("workspace_id"), counts=bindparam("counts")
)


def tally_text(tally: Mapping[Signature, int]) -> str:
    """A tally as the ``counts`` column holds it."""
    return orjson.dumps([[*signature, n] for signature, n in tally.items() if n]).decode()


def signatures(text: str) -> Iterable[tuple[Signature, int]]:
    """The ``counts`` column's signatures and how many entries of each (a tally written
    before decisions §10 has no would-be members)."""
    for found in orjson.loads(text):
        if len(found) == 7:
            agent_id, tool_name, session_id, result, action, minute, n = found
            yield (agent_id, tool_name, session_id, result, action, minute, "", None), n
        else:
            *signature, n = found
            yield tuple(signature), n


@cache
def upsert_statement(dialect_name: str) -> Insert:
    """Add ``count`` to one rollup row (bound by name: ``workspace_id``, the key's columns,
    ``count``; a negative count takes entries back)."""
    dialect = postgresql if dialect_name == "postgresql" else sqlite
    table = AuditCount.__table__
    names = ("workspace_id", *_KEY_COLUMNS, "count")
    statement = dialect.insert(table).values(
        {name: bindparam(name, type_=table.c[name].type) for name in names}
    )
    upsert: Insert = statement.on_conflict_do_update(
        index_elements=[table.c[name] for name in ("workspace_id", *_KEY_COLUMNS)],
        set_={"count": table.c.count + statement.excluded.count},
    )
    return upsert


def upsert_values(workspace_id: str, key: Key, count: int) -> dict[str, Any]:
    return {
        "workspace_id": workspace_id,
        **dict(zip(_KEY_COLUMNS, key, strict=True)),
        "count": count,
    }


def add(session: Session, workspace_id: str, tally: Mapping[Signature, int]) -> None:
    """``tally`` added to the workspace's counts, in ``session``'s transaction, as a tally of
    its own (one insert, folded later like a batch's; a negative count takes entries back:
    erasure, the removal of pruned entries)."""
    if any(tally.values()):
        session.execute(TALLY, {"workspace_id": workspace_id, "counts": tally_text(tally)})


def settled(session: Session, workspace_id: str, start: int, end: int) -> bool:
    """Whether no tally of the workspace still to be folded counts an entry of ``[start,
    end)`` (seconds since the epoch): the rollup rows hold them all (:func:`drain` first)."""
    texts = session.scalars(
        select(AuditTally.counts).where(AuditTally.workspace_id == workspace_id)
    )
    return not any(start <= found[5] < end for text in texts for found, _ in signatures(text))


def forget(
    session: Session, workspace_id: str, start: int, end: int, limit: int | None = None
) -> int:
    """Delete the workspace's rollup rows of ``[start, end)`` (whole hours), once
    :func:`settled`: what a prune does for the hours whose every entry it removes, instead of
    taking those back one by one; how many rows went. With ``limit`` (SQLite), at most that
    many a call, so that the caller's transaction holds the write lock briefly: an hour of a
    busy log has tens of thousands of minute rows. (The entries of a pruned hour are no longer
    taken back by anything, erasure included (``audit.erase``), so the hour may go over several
    transactions.)"""
    where = (
        AuditCount.workspace_id == workspace_id,
        AuditCount.grain.in_(GRAINS),  # each (grain, kind) a range of the bucket index
        AuditCount.kind.in_(KINDS),
        AuditCount.bucket >= start,
        AuditCount.bucket < end,
    )
    statement = delete(AuditCount).where(*where)
    if limit is not None:
        rowid: ColumnElement[int] = literal_column("rowid")
        some = select(rowid).select_from(AuditCount).where(*where).limit(limit)
        statement = delete(AuditCount).where(rowid.in_(some.scalar_subquery()))
    return int(session.connection().execute(statement).rowcount)


def fold(session: Session, bite: int = FOLD_SIGNATURES) -> int:
    """Fold the oldest tallies (at most :data:`FOLD_LIMIT`) into the rollup rows, at most
    ``bite`` distinct signatures of them (the last tally taken may be folded in
    part, the rest of it left), in ``session``'s transaction (a write one: on SQLite it holds
    the write lock, which decisions wait for; on PostgreSQL the tallies taken are locked, and
    a fold running meanwhile skips them); how many of the tallies' signatures were folded.
    Readers see a signature in a tally or in the rollups, never both."""
    query = select(AuditTally.id, AuditTally.workspace_id, AuditTally.counts)
    query = query.order_by(AuditTally.id).limit(FOLD_LIMIT)
    if session.get_bind().dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True)
    budget = bite
    by_workspace: dict[str, Counter[Signature]] = {}
    done: list[int] = []
    part: tuple[int, dict[Signature, int]] | None = None  # the tally folded in part, its rest
    folded = 0
    # fetched as they are taken: a bite sized for a short hold of the lock takes a few
    # tallies of a deletion's (each with some 250 distinct signatures), and reading all
    # FOLD_LIMIT of them each time cost more than the fold
    taken_rows = session.execute(query.execution_options(yield_per=FOLD_FETCH))
    for tally_id, workspace_id, text in taken_rows:
        found = list(signatures(text))
        tally = by_workspace.setdefault(workspace_id, Counter())
        taken = 0
        for signature, n in found:
            if signature not in tally:
                if not budget:
                    break
                budget -= 1
            tally[signature] += n
            taken += 1
        folded += taken
        if taken < len(found):
            if taken:
                part = (tally_id, dict(found[taken:]))
            break
        done.append(tally_id)
    taken_rows.close()
    if part is not None:
        session.execute(
            update(AuditTally).where(AuditTally.id == part[0]).values(counts=tally_text(part[1]))
        )
    changes: dict[tuple[str, Key], int] = {}
    for workspace_id, tally in by_workspace.items():
        changes.update({(workspace_id, key): n for key, n in _expand(tally).items()})
    _upsert(session, changes)
    if done:
        session.execute(delete(AuditTally).where(AuditTally.id.in_(done)))
    return folded


def drain(
    db: Database, bite: int = FOLD_SIGNATURES, *, paced: bool = True, seconds: float | None = None
) -> int:
    """Fold every tally, a bite a transaction (with ``seconds``, only those that fold in about
    that long); how many signatures. The bites are paced (:class:`core.store.paced.Pace`, the
    first of ``bite`` signatures, then each aimed at 10 ms of SQLite's write lock): a
    deletion's or a prune's tallies hold some 250 distinct signatures each, and folded back
    to back in bites of 250 they held the lock 25 ms a bite, a decision waiting behind
    several. (A bulk load, with no decision waiting, folds in larger bites with no pause.)"""
    if paced:
        until = None if seconds is None else time.monotonic() + seconds
        # no checkpoint of its own: serve folds every second, and a passive checkpoint each
        # time, beside a prune's, raised authorize's p99 during the prune by about 1 ms
        # (median of its runs 12.4 against 11.6 ms at 100 calls a second, on 2 cores)
        pace = Pace(db, bite, LONGER_HOLD_SECONDS, checkpoint=False)
        return pace.run(fold, until)
    folded = 0
    while taken := _fold_once(db, bite):
        folded += taken
    return folded


def _fold_once(db: Database, bite: int) -> int:
    with db.transaction(write=True) as session:
        return fold(session, bite)


def _expand(tally: Mapping[Signature, int]) -> Counter[Key]:
    keyed: Counter[Key] = Counter()
    for found, n in tally.items():
        for key in keys_of(found):
            keyed[key] += n
    return keyed


def _upsert(session: Session, changes: Mapping[tuple[str, Key], int]) -> None:
    """The rollup rows changed, in key order (two writers never wait for each other's rows
    in a circle)."""
    values = [upsert_values(w, key, n) for (w, key), n in sorted(changes.items()) if n]
    if values:
        session.execute(upsert_statement(session.get_bind().dialect.name), values)
