"""Fixed-window counters, exact across processes and hosts sharing the database.

One atomic conditional upsert per counter: ``INSERT ... ON CONFLICT DO UPDATE ... WHERE count <
max RETURNING count``. A new window resets the count; an exhausted window returns no row. There
is no read-then-write, so concurrent callers can never both take the last slot.
"""

from __future__ import annotations

from sqlalchemy import case, delete
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from core.db.models import Counter


def consume(session: Session, name: str, window_start: int, maximum: int) -> int | None:
    """Take one slot of counter ``name`` in the window starting at ``window_start``.

    Returns the count after taking it, or None when the window already holds ``maximum``.
    """
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    table = Counter.__table__
    upsert = insert(Counter).values(name=name, window_start=window_start, count=1)
    same_window = table.c.window_start == upsert.excluded.window_start
    stmt = upsert.on_conflict_do_update(
        index_elements=[table.c.name],
        set_={
            "count": case((same_window, table.c.count + 1), else_=1),
            "window_start": upsert.excluded.window_start,
        },
        where=(~same_window) | (table.c.count < maximum),
    ).returning(table.c.count)
    count = session.execute(stmt).scalar()
    return None if count is None else int(count)


def reset(session: Session, prefix: str) -> None:
    """Forget every counter whose name starts with ``prefix`` (a policy's rules changed)."""
    session.execute(delete(Counter).where(Counter.name.startswith(prefix, autoescape=True)))
