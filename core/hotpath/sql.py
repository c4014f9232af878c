"""SQLAlchemy statements compiled once per dialect into what the driver takes: the SQL text
with positional parameters (``?`` for sqlite3, ``%s`` for psycopg) and the order in which to
pass them. The hot path then sends text and a tuple straight to a cursor. Used by
``core.hotpath.reads`` and ``core.hotpath.recorder``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Dialect
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler


@dataclass(frozen=True)
class Compiled:
    """A statement as ``cursor.execute(compiled.sql, compiled.bind(values))`` takes it."""

    sql: str
    #: the bound parameters' names, in the order the SQL expects them
    names: tuple[str, ...]

    def bind(self, values: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(values[name] for name in self.names)


def compile_for(statement: ClauseElement, dialect: Dialect) -> Compiled:
    """``statement`` in ``dialect``'s SQL, with positional parameters whatever the driver's
    own default style (psycopg's is named: ``%(name)s``)."""
    style = "qmark" if dialect.name == "sqlite" else "format"
    positional: Dialect = type(dialect)(paramstyle=style)  # type: ignore[call-arg]
    compiled = statement.compile(dialect=positional)
    assert isinstance(compiled, SQLCompiler)
    return Compiled(str(compiled), tuple(compiled.positiontup or ()))
