"""SQLAlchemy statements compiled once per dialect into what the driver takes: the SQL text
with positional parameters (``?`` for sqlite3, ``%s`` for psycopg) and the order in which to
pass them. The hot path then sends text and a tuple straight to a cursor. Used by
``core.hotpath.reads`` and ``core.hotpath.recorder``.
"""

from __future__ import annotations

from collections.abc import Callable
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
    #: per name, what makes a value what the driver takes (JSON text, naive UTC), or None
    processors: tuple[Callable[[Any], Any] | None, ...] | None = None
    #: the values written into the statement itself (``status == 'pending'``), by name
    fixed: dict[str, Any] | None = None

    def bind(self, values: dict[str, Any]) -> tuple[Any, ...]:
        if self.fixed is not None:
            values = {**self.fixed, **values}
        if self.processors is None:
            return tuple(values[name] for name in self.names)
        return tuple(
            values[name] if process is None else process(values[name])
            for name, process in zip(self.names, self.processors, strict=True)
        )


def compile_for(statement: ClauseElement, dialect: Dialect) -> Compiled:
    """``statement`` in ``dialect``'s SQL, with positional parameters whatever the driver's
    own default style (psycopg's is named: ``%(name)s``)."""
    style = "qmark" if dialect.name == "sqlite" else "format"
    positional: Dialect = type(dialect)(paramstyle=style)  # type: ignore[call-arg]
    compiled = statement.compile(dialect=positional)
    assert isinstance(compiled, SQLCompiler)
    names = tuple(compiled.positiontup or ())
    processors = tuple(
        compiled.binds[name].type.dialect_impl(dialect).bind_processor(dialect) for name in names
    )
    typed = any(process is not None for process in processors)
    fixed = {
        name: compiled.binds[name].effective_value
        for name in names
        if not compiled.binds[name].required
    }
    return Compiled(str(compiled), names, processors if typed else None, fixed or None)
