"""Fixed-window counters, exact across processes and hosts sharing the database.

One atomic conditional upsert per counter: ``INSERT ... ON CONFLICT DO UPDATE ... WHERE count <
max RETURNING count``. A new window resets the count; an exhausted window returns no row. There
is no read-then-write, so concurrent callers can never both take the last slot.

Called on every request (the per-key limit) and every authorize with a rate_limit rule, so the
statement is built once per dialect and only its parameters change.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Protocol, cast

from sqlalchemy import Connection, Table, bindparam, case, delete
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from core.db.models import Counter

_TABLE = cast(Table, Counter.__table__)


@cache
def _upsert(dialect: str) -> Any:
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    upsert = insert(_TABLE).values(
        name=bindparam("name"), window_start=bindparam("window_start"), count=1
    )
    same_window = _TABLE.c.window_start == upsert.excluded.window_start
    return upsert.on_conflict_do_update(
        index_elements=[_TABLE.c.name],
        set_={
            "count": case((same_window, _TABLE.c.count + 1), else_=1),
            "window_start": upsert.excluded.window_start,
        },
        where=(~same_window) | (_TABLE.c.count < bindparam("maximum")),
    ).returning(_TABLE.c.count)


def consume(db: Session | Connection, name: str, window_start: int, maximum: int) -> int | None:
    """Take one slot of counter ``name`` in the window starting at ``window_start``.

    Returns the count after taking it, or None when the window already holds ``maximum``.
    """
    bind = db.get_bind() if isinstance(db, Session) else db
    statement = _upsert(bind.dialect.name)
    params = {"name": name, "window_start": window_start, "maximum": maximum}
    count = db.execute(statement, params).scalar()
    return None if count is None else int(count)


class CounterStore(Protocol):
    """Where counters live for one transaction: a SQLAlchemy session or connection
    (:class:`SqlCounters`), or a group-commit batch (``core.recorder.Batch``)."""

    def consume(self, name: str, window_start: int, maximum: int) -> int | None: ...


class SqlCounters:
    def __init__(self, db: Session | Connection) -> None:
        self.db = db

    def consume(self, name: str, window_start: int, maximum: int) -> int | None:
        return consume(self.db, name, window_start, maximum)


def reset(session: Session, prefix: str) -> None:
    """Forget every counter whose name starts with ``prefix`` (a policy's rules changed)."""
    session.execute(delete(Counter).where(Counter.name.startswith(prefix, autoescape=True)))
