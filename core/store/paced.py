"""Long writes done in short paced batches, so that decisions never wait long behind them: a
prune's removal, the erasure of a deleted agent's entries, the fold of the audit counts'
tallies. On SQLite a write transaction holds the one write lock every decision's commit
waits for; each batch here is sized to hold it about :data:`HOLD_SECONDS` and followed by a
pause as long as it held it, in which the decisions waiting take it; and it tries for the
lock less often than decisions do, which so take it first. PostgreSQL has no such
lock (decisions wait for no row these batches lock): its batches are :data:`MOST` rows, one
after the other."""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy.orm import Session

from core.store.database import Database

#: the most rows one batch takes
MOST = 2000
#: how long one batch should hold SQLite's write lock, which decisions wait for: each batch is
#: sized from the last one, scaled by how far its hold was from this (a few milliseconds of
#: decisions' own commits), and followed by a pause as long as it
HOLD_SECONDS = 0.0025
#: the hold aimed at by work that something waits to see finish: a deletion, whose answer
#: someone waits for, and the fold of the counts' tallies (at 2.5 ms a bite folded some 19
#: signatures, and a backlog of 60,000 took 19 s against 6.8 s at 10 ms)
LONGER_HOLD_SECONDS = 0.01
#: the fewest rows one batch takes (a commit's own cost is its fsync)
FEWEST = 16
#: free pages (of 4 KiB) that make SQLite's file give them back (a step of its incremental
#: vacuum, a transaction and an fsync of its own: not after every small batch); 256 at a time
#: held the lock 4.3 ms (median), longer than the batches themselves
VACUUM_FROM = 64

#: one batch: ``step(session, size)`` does at most ``size`` rows' work in ``session``'s write
#: transaction and says how many rows it did (0: nothing was left)
Step = Callable[[Session, int], int]


class Pace:
    """Batches of one long write. On SQLite each is sized to hold the write lock about
    ``hold`` seconds (:data:`HOLD_SECONDS` by default; the last one's size scaled by how far
    it missed) and followed by a pause as long as it held it; a hold is timed from the moment
    the lock is taken to the end of the COMMIT (the wait for it, behind decisions, is not the
    batch's); the pages the batches freed go back to the file system once they make
    :data:`VACUUM_FROM` (a step of its incremental vacuum, paced the same way), and what they
    wrote to the WAL is checkpointed in the pause (unless ``checkpoint`` is False). With
    ``rest``, each pause is that many times as long as the batch held the lock: a write nobody
    waits to see finish leaves decisions more of it. On PostgreSQL each is ``first`` or
    :data:`MOST` rows, with no pause."""

    def __init__(
        self,
        db: Database,
        first: int | None = None,
        hold: float | None = None,
        checkpoint: bool = True,
        rest: float = 1.0,
    ) -> None:
        self._db = db
        self.size = first or (FEWEST if db.is_sqlite else MOST)
        self._hold = hold or HOLD_SECONDS
        self._checkpoints = checkpoint
        self._rest = rest

    def run(self, step: Step, until: float | None = None) -> int:
        """Batches of ``step`` until one does nothing (or, given ``until``, a
        ``time.monotonic()`` instant, until a batch ends past it); how many rows they did."""
        done = 0
        while gone := self.batch(step):
            done += gone
            if until is not None and time.monotonic() > until:
                break
        return done

    def batch(self, step: Step) -> int:
        """One batch of ``step``; then the next size, and the pause. How many rows it did."""
        with self._db.transaction(write=True, yielding=True) as session:
            session.connection()  # SQLite's BEGIN IMMEDIATE: the write lock is taken here
            locked = time.monotonic()
            gone = step(session, self.size)
            free = 0
            if gone and self._db.is_sqlite:
                free = session.connection().exec_driver_sql("PRAGMA freelist_count").scalar_one()
        if not gone:
            return 0
        if not self._db.is_sqlite:
            return gone  # no write lock to leave to decisions: the next batch at once
        held = time.monotonic() - locked
        # scaled by how far the hold was from the aim (at most halved or doubled a step): a
        # batch's time is a fixed part (its statements, its commit) and a part per row, so
        # the last batch's time per row would keep every batch at the smallest
        scale = min(2.0, max(0.5, self._hold / max(held, 1e-6)))
        self.size = max(FEWEST, min(MOST, int(gone * scale)))
        if free >= VACUUM_FROM:
            held += give_back(self._db) or 0.0
        if self._checkpoints:
            _checkpoint(self._db)
        time.sleep(self._rest * held)
        return gone


def _checkpoint(db: Database) -> None:
    """What the batches wrote to SQLite's WAL copied into the database file, in the pause,
    holding no lock a decision waits for (a passive checkpoint). Otherwise the decision whose
    commit takes the WAL past its threshold copies it all, in that commit."""
    with db.connect() as connection:
        driver = connection.connection.driver_connection
        assert driver is not None
        driver.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()


def give_back(db: Database) -> float | None:
    """At most :data:`VACUUM_FROM` of SQLite's free pages given back to the file system, in a
    transaction of their own (moving a page costs about 12 µs of the write lock; all of a
    long removal's at once held it 26 ms); how long it held the lock, None when there were
    none. (The pragma frees a page a step of its statement, which only ``executescript`` runs
    to the end, in a transaction of its own: it commits the one it finds open, here empty,
    first.)"""
    with db.connect(write=True, yielding=True) as connection:
        free = connection.exec_driver_sql("PRAGMA freelist_count").scalar_one()
        if not free:
            return None
        locked = time.monotonic()
        driver = connection.connection.driver_connection
        assert driver is not None
        driver.executescript(f"PRAGMA incremental_vacuum({min(int(free), VACUUM_FROM)});")
    return time.monotonic() - locked
