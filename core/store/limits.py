"""Fixed-window counters, exact across processes and hosts sharing the database.

One atomic conditional upsert per counter: ``INSERT ... ON CONFLICT DO UPDATE ... WHERE count +
amount <= max RETURNING count, window_start`` (a rate limit's amount is one call; a budget's,
the call's amount in units). A later window resets the count; a window that cannot take the
amount returns no row. A counter never moves back: a call of an earlier window than the stored
one (decided a moment before a concurrent call that opened the next window, or on a host whose
clock lags) is counted in the stored window, never resetting it, and the window returned says
so. There is no read-then-write, so concurrent callers can never both take the last slot.

Called on every request (the per-key limit) and every authorize with a rate_limit or budget
rule, so the statement is built once per dialect and only its parameters change.
"""

from __future__ import annotations

from functools import cache
from typing import Any, NamedTuple, Protocol

from sqlalchemy import (
    Connection,
    Insert,
    and_,
    bindparam,
    case,
    delete,
    or_,
    select,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from core.store.models import Counter


class Counted(NamedTuple):
    """What a counter holds after a call was counted, and the window it was counted in (the
    call's own, or a later one another call opened first: a counter never moves back)."""

    held: int
    window_start: int


@cache
def upsert_statement(dialect_name: str) -> Insert:
    """The one counting statement, for ``sqlite`` or ``postgresql``: add ``amount``, or return
    no row when the window cannot take it. Bound by name: ``name``, ``window_start``,
    ``window_end``, ``amount``, ``maximum`` (an amount over ``maximum`` is never passed: an
    empty window would take it). The decision recorder compiles it for the driver
    (``core.hotpath``), everything else runs it through SQLAlchemy."""
    dialect = postgresql if dialect_name == "postgresql" else sqlite
    table = Counter.__table__
    window = bindparam("window_start", type_=table.c.window_start.type)
    amount = bindparam("amount", type_=table.c.count.type)
    statement = dialect.insert(table).values(
        name=bindparam("name", type_=table.c.name.type),
        window_start=window,
        window_end=bindparam("window_end", type_=table.c.window_end.type),
        count=amount,
    )
    later_window = table.c.window_start < statement.excluded.window_start
    maximum = bindparam("maximum", type_=table.c.count.type)
    upsert: Insert = statement.on_conflict_do_update(
        index_elements=[table.c.name],
        set_={
            "count": case((later_window, statement.excluded.count), else_=table.c.count + amount),
            "window_start": case(
                (later_window, statement.excluded.window_start), else_=table.c.window_start
            ),
            "window_end": case(
                (later_window, statement.excluded.window_end), else_=table.c.window_end
            ),
        },
        where=or_(later_window, table.c.count + amount <= maximum),
    ).returning(table.c.count, table.c.window_start)
    return upsert


def upsert_values(
    name: str, window_start: int, maximum: int, amount: int, window_end: int | None
) -> dict[str, Any]:
    """The upsert's bound values by name (the statement of :func:`upsert_statement`)."""
    return {
        "name": name,
        "window_start": window_start,
        "window_end": window_end,
        "amount": amount,
        "maximum": maximum,
    }


def consume(
    db: Session | Connection,
    name: str,
    window_start: int,
    maximum: int,
    amount: int = 1,
    window_end: int | None = None,
) -> Counted | None:
    """Add ``amount`` (at most ``maximum``) to counter ``name`` in the window starting at
    ``window_start`` (and ending at ``window_end``, epoch seconds, when known).

    Returns the count after adding it and the window it went to, or None when the window
    cannot take it.
    """
    params = upsert_values(name, window_start, maximum, amount, window_end)
    bind = db.get_bind() if isinstance(db, Session) else db
    statement = upsert_statement(bind.dialect.name)
    row = db.execute(statement, params).first()
    return None if row is None else Counted(int(row[0]), int(row[1]))


#: what a counter holds and the window it holds it for: bound by ``name``; no row when unused
STORED = select(Counter.__table__.c.count, Counter.__table__.c.window_start).where(
    Counter.__table__.c.name == bindparam("name")
)


def stored(db: Session | Connection, name: str) -> Counted | None:
    """What counter ``name`` holds, and in which window (None when it was never used)."""
    row = db.execute(STORED, {"name": name}).first()
    return None if row is None else Counted(int(row[0]), int(row[1]))


def used(db: Session | Connection, name: str, window_start: int) -> int:
    """What counter ``name`` holds in the window starting at ``window_start``."""
    found = stored(db, name)
    return found.held if found is not None and found.window_start == window_start else 0


class CounterStore(Protocol):
    """Where counters live for one transaction: a SQLAlchemy session or connection
    (:class:`SqlCounters`), or a group-commit batch (``core.hotpath.recorder.Batch``)."""

    def consume(
        self,
        name: str,
        window_start: int,
        maximum: int,
        amount: int = 1,
        window_end: int | None = None,
    ) -> Counted | None: ...

    def stored(self, name: str) -> Counted | None: ...


class SqlCounters:
    def __init__(self, db: Session | Connection) -> None:
        self.db = db

    def consume(
        self,
        name: str,
        window_start: int,
        maximum: int,
        amount: int = 1,
        window_end: int | None = None,
    ) -> Counted | None:
        return consume(self.db, name, window_start, maximum, amount, window_end)

    def stored(self, name: str) -> Counted | None:
        return stored(self.db, name)


#: the mark in a per-session counter's name (``core.domain.limits.LimitRef.session_key``)
SESSION_MARK = ":session:"


def sweep_sessions(db: Session | Connection, now_epoch: int) -> int:
    """Remove the per-session counters whose window is over (a session's counters do not
    outlive their window); returns how many went."""
    result: Any = db.execute(
        delete(Counter).where(
            and_(
                Counter.name.contains(SESSION_MARK, autoescape=True),
                Counter.window_end <= now_epoch,
            )
        )
    )
    return int(result.rowcount or 0)


def reset(session: Session, prefix: str) -> None:
    """Forget every counter whose name starts with ``prefix`` (a policy's rules changed)."""
    session.execute(delete(Counter).where(Counter.name.startswith(prefix, autoescape=True)))
