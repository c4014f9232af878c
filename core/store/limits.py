"""Fixed-window counters, exact across processes and hosts sharing the database.

One atomic conditional upsert per counter: ``INSERT ... ON CONFLICT DO UPDATE ... WHERE count <
max RETURNING count``. A new window resets the count; an exhausted window returns no row. There
is no read-then-write, so concurrent callers can never both take the last slot.

Called on every request (the per-key limit) and every authorize with a rate_limit rule, so the
statement is built once per dialect and only its parameters change.
"""

from __future__ import annotations

from typing import Protocol

from sqlalchemy import Connection, delete, text
from sqlalchemy.orm import Session

from core.store.models import Counter

#: the one counting statement; SQLite and PostgreSQL both take it as written (the decision
#: recorder runs it through the driver directly, everything else through SQLAlchemy)
UPSERT_SQL = (
    "INSERT INTO rate_counters (name, window_start, count) VALUES (:name, :window_start, 1) "
    "ON CONFLICT (name) DO UPDATE SET "
    "count = CASE WHEN rate_counters.window_start = excluded.window_start "
    "THEN rate_counters.count + 1 ELSE 1 END, window_start = excluded.window_start "
    "WHERE rate_counters.window_start <> excluded.window_start "
    "OR rate_counters.count < :maximum "
    "RETURNING count"
)
_UPSERT = text(UPSERT_SQL)


def consume(db: Session | Connection, name: str, window_start: int, maximum: int) -> int | None:
    """Take one slot of counter ``name`` in the window starting at ``window_start``.

    Returns the count after taking it, or None when the window already holds ``maximum``.
    """
    params = {"name": name, "window_start": window_start, "maximum": maximum}
    count = db.execute(_UPSERT, params).scalar()
    return None if count is None else int(count)


class CounterStore(Protocol):
    """Where counters live for one transaction: a SQLAlchemy session or connection
    (:class:`SqlCounters`), or a group-commit batch (``core.hotpath.recorder.Batch``)."""

    def consume(self, name: str, window_start: int, maximum: int) -> int | None: ...


class SqlCounters:
    def __init__(self, db: Session | Connection) -> None:
        self.db = db

    def consume(self, name: str, window_start: int, maximum: int) -> int | None:
        return consume(self.db, name, window_start, maximum)


def reset(session: Session, prefix: str) -> None:
    """Forget every counter whose name starts with ``prefix`` (a policy's rules changed)."""
    session.execute(delete(Counter).where(Counter.name.startswith(prefix, autoescape=True)))
