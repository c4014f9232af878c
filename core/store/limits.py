"""Fixed-window counters, exact across processes and hosts sharing the database.

One atomic conditional upsert per counter: ``INSERT ... ON CONFLICT DO UPDATE ... WHERE count <
max RETURNING count``. A later window resets the count; an exhausted window returns no row. A
counter never moves back: a call of an earlier window than the stored one (decided a moment
before a concurrent call that opened the next window, or on a host whose clock lags) is counted
in the stored window, never resetting it. There is no read-then-write, so concurrent callers
can never both take the last slot.

Called on every request (the per-key limit) and every authorize with a rate_limit rule, so the
statement is built once per dialect and only its parameters change.
"""

from __future__ import annotations

from functools import cache
from typing import Protocol

from sqlalchemy import Connection, Insert, bindparam, case, delete, literal_column, or_
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnClause

from core.store.models import Counter

#: a count of one, written into the SQL rather than bound
ONE: ColumnClause[int] = literal_column("1")


@cache
def upsert_statement(dialect_name: str) -> Insert:
    """The one counting statement, for ``sqlite`` or ``postgresql``: take a slot, or return no
    row when the window is full. Bound by name: ``name``, ``window_start``, ``maximum``. The
    decision recorder compiles it for the driver (``core.hotpath``), everything else runs it
    through SQLAlchemy."""
    dialect = postgresql if dialect_name == "postgresql" else sqlite
    table = Counter.__table__
    window = bindparam("window_start", type_=table.c.window_start.type)
    statement = dialect.insert(table).values(
        name=bindparam("name", type_=table.c.name.type), window_start=window, count=ONE
    )
    later_window = table.c.window_start < statement.excluded.window_start
    maximum = bindparam("maximum", type_=table.c.count.type)
    upsert: Insert = statement.on_conflict_do_update(
        index_elements=[table.c.name],
        set_={
            "count": case((later_window, ONE), else_=table.c.count + ONE),
            "window_start": case(
                (later_window, statement.excluded.window_start), else_=table.c.window_start
            ),
        },
        where=or_(later_window, table.c.count < maximum),
    ).returning(table.c.count)
    return upsert


def consume(db: Session | Connection, name: str, window_start: int, maximum: int) -> int | None:
    """Take one slot of counter ``name`` in the window starting at ``window_start``.

    Returns the count after taking it, or None when the window already holds ``maximum``.
    """
    params = {"name": name, "window_start": window_start, "maximum": maximum}
    bind = db.get_bind() if isinstance(db, Session) else db
    statement = upsert_statement(bind.dialect.name)
    count = db.execute(statement, params).scalar()
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
