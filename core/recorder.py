"""Group commit for decisions: the writes of concurrent authorize calls (per-key slot,
rate-limit counters, audit entry) share one transaction and one durable commit.

Each request thread hands its write work to :meth:`Recorder.run` as a job and blocks until the
transaction holding it has committed, so nothing is acknowledged before it is durable and a
failed commit fails every job in it (the callers answer 500, never an allow). A single writer
thread per process takes every job queued at that moment, runs each inside a savepoint of its
own (one failing job does not take the others down), and commits once. Under load this turns
N fsyncs into one; alone, a job waits for nothing.

The writer talks to the driver directly, with statements written out for SQLite and
PostgreSQL: on this path SQLAlchemy's per-statement machinery costs more than the SQL. It keeps
its connection from batch to batch, out of the pool and so never pinged: when that connection
turns out broken (the database restarted, a proxy or firewall dropped it while the process was
idle) before the batch's COMMIT was sent, nothing of the batch can have been committed, and it
runs once more on a new connection instead of failing decisions the database could take.
Called by ``core.decisions``; nothing else writes through it.
"""

from __future__ import annotations

import logging
import queue
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from sqlalchemy import Engine

from core.db.models import AuditEntry
from core.errors import StorageError
from core.limits import UPSERT_SQL

log = logging.getLogger("agentauth.recorder")
T = TypeVar("T")
MAX_BATCH = 256
#: how long a batch waits for SQLite's write lock when no setting says otherwise
LOCK_WAIT_SECONDS = 30.0
_AUDIT_COLUMNS = (
    "id", "workspace_id", "agent_id", "agent_ref", "key_id", "action", "tool_name",
    "parameters", "result", "policy_id", "rule_index", "reason", "latency_ms", "timestamp",
)  # fmt: skip
# built from the fixed column list above, never from input
_INSERT = "INSERT INTO audit_log ({}) VALUES ({})".format(  # noqa: S608
    ", ".join(_AUDIT_COLUMNS), ", ".join("?" for _ in _AUDIT_COLUMNS)
)


class Batch:
    """What a job may do inside the shared transaction."""

    def __init__(self, cursor: Any, dialect: Any, sqlite: bool) -> None:
        self._cursor = cursor
        self._sqlite = sqlite
        # sqlite3 takes :name parameters as written; psycopg wants %(name)s
        self._upsert = UPSERT_SQL if sqlite else re.sub(r":(\w+)", r"%(\1)s", UPSERT_SQL)
        self._insert = _INSERT if sqlite else _INSERT.replace("?", "%s")
        columns = AuditEntry.__table__.c
        self._processors = {
            name: columns[name].type.dialect_impl(dialect).bind_processor(dialect)
            for name in ("parameters", "timestamp")
        }
        self._savepoints = 0

    def consume(self, name: str, window_start: int, maximum: int) -> int | None:
        """One slot of a fixed-window counter (see core.limits); None when it is full."""
        params = {"name": name, "window_start": window_start, "maximum": maximum}
        self._cursor.execute(self._upsert, params)
        row = self._cursor.fetchone()
        return None if row is None else int(row[0])

    def append_audit(self, row: dict[str, Any]) -> None:
        values = []
        for column in _AUDIT_COLUMNS:
            value = row[column]
            process = self._processors.get(column)
            values.append(process(value) if process is not None else value)
        self._cursor.execute(self._insert, values)

    def savepoint(self) -> str:
        self._savepoints += 1
        name = f"sp{self._savepoints}"
        self._cursor.execute(f"SAVEPOINT {name}")
        return name

    def release(self, name: str) -> None:
        self._cursor.execute(f"RELEASE SAVEPOINT {name}")

    def rollback_to(self, name: str) -> None:
        self._cursor.execute(f"ROLLBACK TO SAVEPOINT {name}")
        self._cursor.execute(f"RELEASE SAVEPOINT {name}")


Job = Callable[[Batch], Any]


class _StaleConnection(Exception):
    """The connection kept from an earlier batch was found broken before this batch's COMMIT
    was sent: the batch may run again on a new one."""


class Recorder:
    """The writer thread of one process for one database."""

    def __init__(
        self,
        engine: Engine,
        write_lock: threading.Lock | None,
        lock_wait_seconds: float = LOCK_WAIT_SECONDS,
    ) -> None:
        self._engine = engine
        self._sqlite = engine.dialect.name == "sqlite"
        self._write_lock = write_lock
        self._lock_wait = lock_wait_seconds
        self._queue: queue.SimpleQueue[tuple[Job, Future[Any]] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._connection: Any = None

    def run(self, job: Callable[[Batch], T]) -> T:
        """Run ``job`` in the next group transaction; its result once that has committed."""
        self._ensure_started()
        future: Future[T] = Future()
        self._queue.put((job, future))
        return future.result()

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=30)
            self._thread = None
        self._drop_connection()  # never back to the pool: it was tuned for this thread

    def _ensure_started(self) -> None:
        if self._thread is None:
            with self._start_lock:
                if self._thread is None:
                    thread = threading.Thread(target=self._loop, name="recorder", daemon=True)
                    thread.start()
                    self._thread = thread

    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            jobs = [first]
            while len(jobs) < MAX_BATCH:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._queue.put(None)  # stop after this batch
                    break
                jobs.append(more)
            self._commit_batch(jobs)

    def _commit_batch(self, jobs: list[tuple[Job, Future[Any]]]) -> None:
        results: list[tuple[Future[Any], bool, Any]] = []
        try:
            try:
                self._locked_transaction(jobs, results)
            except _StaleConnection:  # nothing of the batch was committed: once more, anew
                log.warning("the database connection was lost; running the batch on a new one")
                self._drop_connection()
                self._locked_transaction(jobs, results)
        except Exception as exc:  # the commit failed: nobody in the batch is acknowledged
            log.error("decision batch of %d could not be committed", len(jobs), exc_info=exc)
            self._drop_connection()
            for _, future in jobs:
                future.set_exception(StorageError("the decision could not be recorded"))
            return
        for future, ok, value in results:
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

    def _locked_transaction(self, jobs: list[tuple[Job, Future[Any]]], results: list[Any]) -> None:
        if self._write_lock is not None:
            with self._write_lock:
                self._transaction(jobs, results)
        else:
            self._transaction(jobs, results)

    def _transaction(self, jobs: list[tuple[Job, Future[Any]]], results: list[Any]) -> None:
        reused = self._connection is not None
        connection = self._connect()
        cursor = connection.cursor()
        committing = False
        try:
            self._begin(cursor)
            batch = Batch(cursor, self._engine.dialect, self._sqlite)
            for job, future in jobs:
                mark = batch.savepoint()
                try:
                    value = job(batch)
                except Exception as exc:  # this job alone fails
                    batch.rollback_to(mark)
                    results.append((future, False, exc))
                else:
                    batch.release(mark)
                    results.append((future, True, value))
            committing = True  # from here on, a failure may hide a commit that happened
            if self._sqlite:
                cursor.execute("COMMIT")
            else:
                connection.commit()
        except BaseException as exc:
            results.clear()
            self._rollback(connection, cursor)
            if reused and not committing and self._is_disconnect(exc, connection, cursor):
                raise _StaleConnection from exc
            raise
        finally:
            cursor.close()

    def _begin(self, cursor: Any) -> None:
        if not self._sqlite:
            return  # psycopg opens the transaction itself
        deadline = time.monotonic() + self._lock_wait
        while True:
            try:
                cursor.execute("BEGIN IMMEDIATE")
                return
            except Exception as exc:  # another process holds the write lock
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.0002)  # far finer than SQLite's own busy handler

    def _rollback(self, connection: Any, cursor: Any) -> None:
        try:
            if self._sqlite:
                cursor.execute("ROLLBACK")
            else:
                connection.rollback()
        except Exception:
            log.warning("rollback after a failed decision batch failed too")

    def _is_disconnect(self, exc: BaseException, connection: Any, cursor: Any) -> bool:
        dbapi = self._engine.dialect.loaded_dbapi
        return isinstance(exc, dbapi.Error) and bool(
            self._engine.dialect.is_disconnect(exc, connection.driver_connection, cursor)
        )

    def _connect(self) -> Any:
        if self._connection is None:
            self._connection = self._engine.raw_connection()
            if self._sqlite:
                self._connection.driver_connection.execute("PRAGMA busy_timeout=0")
        return self._connection

    def _drop_connection(self) -> None:
        if self._connection is not None:
            try:
                self._connection.invalidate()
            except Exception:
                log.warning("could not close a broken database connection")
            self._connection = None
