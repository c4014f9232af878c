"""The two reads every authorize call makes (the caller's API key, the agent row), sent straight
to the driver on one pooled connection per request: SQLAlchemy selects compiled once per
dialect (``core.hotpath.sql``), then a cursor and a tuple, because SQLAlchemy's execution
machinery costs several times the SQL on this path (bench/RESULTS.md). Nothing is cached
between requests: a key revoked or an agent suspended by any process is in force for the very
next call. Driver errors become :class:`core.domain.errors.StorageError` here, and a connection
found broken is dropped rather than returned to the pool.

Used by the API's auth hook (``core.store.keys.authenticate``) and by ``core.hotpath.decisions``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, bindparam, select
from sqlalchemy.exc import SQLAlchemyError

from core.domain.errors import StorageError
from core.hotpath.sql import Compiled, compile_for
from core.store.keys import KeyRow
from core.store.models import Agent, ApiKey

_KEY = select(
    ApiKey.id, ApiKey.workspace_id, ApiKey.scopes, ApiKey.expires_at, ApiKey.revoked_at
).where(ApiKey.key_hash == bindparam("key_hash"))
_AGENT = select(Agent.id, Agent.status, Agent.policy_version, Agent.created_at).where(
    Agent.id == bindparam("agent_id"), Agent.workspace_id == bindparam("workspace_id")
)


@dataclass(frozen=True, slots=True)
class AgentRow:
    """``created_at`` is as the driver returned it: it only tells one incarnation of an agent
    id from another (``core.hotpath.decisions.PolicyCache``)."""

    id: str
    status: str
    policy_version: int
    created_at: Any


class _Statements:
    """The SQL in the driver's parameter style, and how to read a stored timestamp."""

    def __init__(self, engine: Engine) -> None:
        dialect = engine.dialect
        self.key = compile_for(_KEY, dialect)
        self.agent = compile_for(_AGENT, dialect)
        column_type = ApiKey.__table__.c.expires_at.type
        process = column_type.dialect_impl(dialect).result_processor(dialect, None)
        self.timestamp: Callable[[Any], datetime | None] = process or (lambda value: value)
        self.dbapi_error: type[Exception] = dialect.loaded_dbapi.Error
        self.dialect = dialect


_STATEMENTS: dict[int, _Statements] = {}


def _statements(engine: Engine) -> _Statements:
    found = _STATEMENTS.get(id(engine.dialect))
    if found is None or found.dialect is not engine.dialect:
        found = _STATEMENTS[id(engine.dialect)] = _Statements(engine)
    return found


class Reads:
    """One request's reads: a pooled driver connection, checked out on first use and given
    back by :meth:`close`. Each read sees what was committed when it ran."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._sql = _statements(engine)
        self._connection: Any = None
        self._connect: Callable[[], Any] | None = None
        self.broken = False
        self._keys: dict[str, KeyRow | None] | None = None
        self._agents: dict[tuple[str, str], AgentRow | None] | None = None

    @classmethod
    def for_batch(cls, engine: Engine, connect: Callable[[], Any]) -> Reads:
        """The reads of one batch of the recorder's, on the connection ``connect`` returns (the
        recorder's own, which these reads never close: a broken one is reported by
        :attr:`broken`). A row read once is not read again: the calls of a batch, often by one
        key for one agent, are decided on what was committed when its reads began."""
        reads = cls(engine)
        reads._connect = connect
        reads._keys, reads._agents = {}, {}
        return reads

    def api_key(self, key_hash: str) -> KeyRow | None:
        if self._keys is not None and key_hash in self._keys:
            return self._keys[key_hash]
        row = self._fetch(self._sql.key, {"key_hash": key_hash})
        found = None
        if row is not None:
            expires = None if row[3] is None else self._sql.timestamp(row[3])
            found = KeyRow(row[0], row[1], row[2], expires, row[4] is not None)
        if self._keys is not None:
            self._keys[key_hash] = found
        return found

    def agent(self, agent_id: str, workspace_id: str) -> AgentRow | None:
        if self._agents is not None and (agent_id, workspace_id) in self._agents:
            return self._agents[agent_id, workspace_id]
        row = self._fetch(self._sql.agent, {"agent_id": agent_id, "workspace_id": workspace_id})
        found = None if row is None else AgentRow(row[0], row[1], row[2], row[3])
        if self._agents is not None:
            self._agents[agent_id, workspace_id] = found
        return found

    def close(self) -> None:
        """Give the connection back; a later read takes one again."""
        connection, self._connection = self._connection, None
        if connection is not None and self._connect is None:
            try:
                connection.close()  # back to the pool, which rolls back the read
            except Exception:
                connection.invalidate()

    def _fetch(self, statement: Compiled, values: dict[str, Any]) -> Any:
        try:
            if self._connection is None:
                connect = self._connect or self._engine.raw_connection
                self._connection = connect()
            cursor = self._connection.cursor()
            try:
                cursor.execute(statement.sql, statement.bind(values))
                return cursor.fetchone()
            finally:
                cursor.close()
        except self._sql.dbapi_error as exc:
            self._drop(exc)
            raise StorageError("the database could not complete the request") from exc
        except SQLAlchemyError as exc:  # the pool could not hand out a working connection
            raise StorageError("the database connection was lost") from exc

    def _drop(self, exc: Any) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        dialect = self._sql.dialect
        if self._connect is not None:  # not ours to close
            try:
                if dialect.is_disconnect(exc, connection.driver_connection, None):
                    self.broken = True  # its owner drops it
                else:  # a failed statement: the next read must not find the transaction void
                    connection.rollback()
            except Exception:
                self.broken = True
            return
        try:
            if dialect.is_disconnect(exc, connection.driver_connection, None):
                connection.invalidate(exc)
            else:
                connection.close()
        except Exception:
            connection.invalidate()
