"""Group commit for decisions: the writes of concurrent authorize calls (per-key slot,
rate-limit counters, audit entry) share one transaction and one durable commit.

One thread per process, the recorder's, talks to the database for decisions: callers hand it
their work as jobs and wait for their result, a thread with :meth:`Recorder.run` or a
coroutine on the server's event loop with :meth:`Recorder.arun`. It takes every job queued at
that moment as one batch, so a batch grows with the load: the jobs that arrive while one batch
commits make up the next. Nothing is acknowledged before the transaction holding it has
committed, and a failed commit fails every job in it (the callers answer 500, never an allow).
A job may come with a read phase, run on the same thread before the batch's write transaction
begins (an authorize call's key, agent and decision): what the job reads is then what was
committed when its batch started, and the event loop never waits for the database. Callers are
woken once per batch per event loop (one hand-off back), not once per job.

A batch runs its jobs one after the other and keeps their audit rows for one ``executemany``;
should a job fail after it changed something, or the rows fail to insert, the batch runs again
with a savepoint per job, so one failing job does not take the others down.

The thread talks to the driver directly, with SQLAlchemy statements compiled once per dialect
(``core.hotpath.sql``): on this path SQLAlchemy's per-statement machinery costs more than the
SQL. It keeps its connection from batch to batch, out of the pool and so never pinged: when
that connection turns out broken (the database restarted, a proxy or firewall dropped it while
the process was idle) before the batch's COMMIT was sent, nothing of the batch can have been
committed, and it runs once more on a new connection instead of failing decisions the
database could take. Called by ``core.hotpath.decisions`` (through ``api.authorize``),
``api.approvals`` and the tests' helper that records audit entries as decisions do. One module,
over 300 lines, because the batch, its statements and the thread's retry rules change
together: each relies on what the others promise about a transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar, cast

from sqlalchemy import Engine, bindparam, insert

from core.domain.errors import StorageError
from core.hotpath.approvals import ApprovalStatements
from core.hotpath.chain import AuditRow, Chain, ChainStatements, Mark
from core.hotpath.reads import Reads
from core.hotpath.sql import Compiled, compile_for
from core.store import audit
from core.store.database import Database, begin_immediate
from core.store.limits import STORED, Counted, upsert_statement, upsert_values
from core.store.models import AuditEntry

log = logging.getLogger("agentauth.recorder")
T = TypeVar("T")
MAX_BATCH = 256
#: how many of the last batches say how many calls a batch may expect (see Recorder._gather)
RECENT_BATCHES = 8
#: after this long with no call at all, the last batches say nothing of the next one: the load
#: stopped (under load a worker's calls are away for a few milliseconds between batches)
FORGET_AFTER_SECONDS = 0.1
#: the longest a batch waits for the calls it expects, whatever the last batch took (one that
#: waited for SQLite's write lock may have taken seconds, and the calls expected from the last
#: batches may not come); under load a batch takes a few milliseconds
GATHER_MAX_SECONDS = 0.05
#: how long a batch waits for SQLite's write lock when no setting says otherwise
LOCK_WAIT_SECONDS = 30.0
_AUDIT_COLUMNS = (
    "id", "workspace_id", "agent_id", "agent_ref", "key_id", "action", "tool_name",
    "parameters", "result", "policy_id", "rule_index", "reason", "latency_ms", "timestamp",
    "approval_id", "session_id", "hash_version", "would_result", "would_policy_id",
    "would_rule_index", "would_reason",
)  # fmt: skip
#: the chain's columns, last: a batch fills them in (core.hotpath.chain)
_CHAIN_COLUMNS = ("seq", "entry_hash", "hash")
_INSERT = insert(AuditEntry).values({c: bindparam(c) for c in (*_AUDIT_COLUMNS, *_CHAIN_COLUMNS)})


class Statements:
    """The recorder's SQL in the driver's parameter style, and how audit values are bound."""

    def __init__(self, dialect: Any) -> None:
        self.upsert = compile_for(upsert_statement(dialect.name), dialect)
        self.stored = compile_for(STORED, dialect)
        self.approvals = ApprovalStatements(dialect)
        self.chain = ChainStatements(dialect)
        insert_audit = compile_for(_INSERT, dialect)
        # audit rows are made as tuples in _AUDIT_COLUMNS' order (see audit_row), the chain's
        # columns after them
        assert insert_audit.names == (*_AUDIT_COLUMNS, *_CHAIN_COLUMNS), insert_audit.names
        self.insert = insert_audit.sql
        columns = AuditEntry.__table__.c
        processors = {
            name: columns[name].type.dialect_impl(dialect).bind_processor(dialect)
            for name in ("parameters", "timestamp")
        }
        self.processors = tuple(processors.get(column) for column in _AUDIT_COLUMNS)

    def audit_row(self, row: dict[str, Any], parameters_json: bytes | None = None) -> AuditRow:
        """An audit row as the driver takes it (JSON text, naive UTC timestamp, ...), with its
        canonical JSON for the chain: made before the batch when it can be (and when it cannot,
        at least its parameters' part, ``parameters_json``)."""
        values = tuple(
            row[column] if process is None else process(row[column])
            for column, process in zip(_AUDIT_COLUMNS, self.processors, strict=True)
        )
        return AuditRow(
            values, row["workspace_id"], audit.leaf(row, parameters_json), audit.signature(row)
        )


class Batch:
    """What a job may do inside the shared transaction.

    ``deferred``: audit rows are kept and sent in one ``executemany`` by :meth:`flush`, after
    every job ran; ``writes`` counts what a job changed, so a job that failed before changing
    anything can fail alone without a savepoint of its own. Each row joins its workspace's
    chain as it is written; :meth:`flush` also stores the chains' new heads.
    """

    def __init__(self, cursor: Any, statements: Statements, deferred: bool) -> None:
        self._cursor = cursor
        self._sql = statements
        self._chain = Chain(cursor, statements.chain)
        self._rows: list[AuditRow] | None = [] if deferred else None
        self._marks: dict[str, Mark] = {}
        self._savepoints = 0
        self.writes = 0

    def consume(
        self,
        name: str,
        window_start: int,
        maximum: int,
        amount: int = 1,
        window_end: int | None = None,
    ) -> Counted | None:
        """``amount`` added to a fixed-window counter (see core.store.limits); None when its
        window cannot take it (and then nothing was changed)."""
        params = upsert_values(name, window_start, maximum, amount, window_end)
        self._cursor.execute(self._sql.upsert.sql, self._sql.upsert.bind(params))
        row = self._cursor.fetchone()
        if row is None:
            return None
        self.writes += 1
        return Counted(int(row[0]), int(row[1]))

    def stored(self, name: str) -> Counted | None:
        """What a counter holds, and in which window (None when it was never used)."""
        rows = self.read(self._sql.stored, {"name": name})
        return Counted(int(rows[0][0]), int(rows[0][1])) if rows else None

    def execute(self, compiled: Compiled, values: dict[str, Any]) -> Any:
        """Any other write of the hot path (approvals, webhook events): the cursor, to fetch
        from. Counted as a change, so a job that fails after it ran is undone."""
        self.writes += 1
        self._cursor.execute(compiled.sql, compiled.bind(values))
        return self._cursor

    def read(self, compiled: Compiled, values: dict[str, Any]) -> list[Any]:
        """The rows of a SELECT, inside the batch's transaction."""
        self._cursor.execute(compiled.sql, compiled.bind(values))
        return list(self._cursor.fetchall())

    def append_audit(self, row: dict[str, Any], parameters_json: bytes | None = None) -> None:
        self.insert_audit(self._sql.audit_row(row, parameters_json))

    def insert_audit(self, row: AuditRow) -> None:
        """An audit row already made by :meth:`Statements.audit_row`."""
        self.writes += 1
        if self._rows is not None:
            self._rows.append(row)
        else:
            self._cursor.execute(self._sql.insert, self._chain.extend(row))

    def flush(self) -> None:
        """The kept audit rows, in the order their jobs ran, and the chains' heads."""
        if self._rows:
            self._cursor.executemany(self._sql.insert, self._chain.extend_all(self._rows))
            self._rows.clear()
        self._chain.write()

    def savepoint(self) -> str:
        self._savepoints += 1
        name = f"sp{self._savepoints}"
        self._cursor.execute(f"SAVEPOINT {name}")
        self._marks[name] = self._chain.mark()
        return name

    def release(self, name: str) -> None:
        self._cursor.execute(f"RELEASE SAVEPOINT {name}")
        del self._marks[name]

    def rollback_to(self, name: str) -> None:
        self._cursor.execute(f"ROLLBACK TO SAVEPOINT {name}")
        self._cursor.execute(f"RELEASE SAVEPOINT {name}")
        self._chain.back_to(self._marks.pop(name))


Job = Callable[[Batch], Any]
#: a job's read phase: given the recorder's reads, the job to run in the batch, or None when
#: there is nothing to write (the caller is then answered None, without a batch)
Read = Callable[[Reads], Job | None]


class _Entry:
    """One job waiting for its batch, and how its caller is woken: a lock held until the
    result is in (a thread), or a future of an event loop (a coroutine)."""

    __slots__ = ("_done", "future", "job", "loop", "ok", "read", "value")

    def __init__(
        self, job: Job | None, read: Read | None, loop: asyncio.AbstractEventLoop | None = None
    ) -> None:
        self.job = job
        self.read = read
        self.ok = False
        self.value: Any = None
        self.loop = loop
        self.future: asyncio.Future[None] | None = None
        self._done: threading.Lock | None = None
        if loop is None:
            self._done = threading.Lock()
            self._done.acquire()
        else:
            self.future = loop.create_future()

    def settle(self, ok: bool, value: Any) -> None:
        self.ok, self.value = ok, value

    def wait(self) -> None:
        assert self._done is not None
        self._done.acquire()

    def result(self) -> Any:
        if self.ok:
            return self.value
        raise self.value


def _wake(entries: list[_Entry]) -> None:
    """The callers of settled entries: threads at once, coroutines by one call into each
    event loop for all of its entries."""
    loops: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
    for entry in entries:
        if entry.loop is None:
            assert entry._done is not None
            entry._done.release()
        else:
            assert entry.future is not None
            loops.setdefault(entry.loop, []).append(entry.future)
    for loop, futures in loops.items():
        # a loop already closed has nobody waiting any more
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_resolve, futures)


def _resolve(futures: list[asyncio.Future[None]]) -> None:
    for future in futures:
        if not future.done():  # a caller that was cancelled no longer waits
            future.set_result(None)


class _StaleConnection(Exception):
    """The connection kept from an earlier batch was found broken before this batch's COMMIT
    was sent: the batch may run again on a new one."""


class Recorder:
    """Group commit for one process and one database, on a thread of its own, started on first
    use (and again should it ever have died). A process forked from one that has used the
    recorder must not use it (its locks may have been held at the fork): ``agentauth serve``
    forks its workers before any of them makes an app."""

    def __init__(
        self,
        engine: Engine,
        write_lock: threading.Lock | None,
        lock_wait_seconds: float = LOCK_WAIT_SECONDS,
        on_commit: Callable[[int], None] | None = None,
    ) -> None:
        """``on_commit`` is told how many jobs each committed batch held (the API's metric)."""
        self._engine = engine
        self._on_commit = on_commit
        self._sqlite = engine.dialect.name == "sqlite"
        self._write_lock = write_lock
        self._lock_wait = lock_wait_seconds
        self.statements = Statements(engine.dialect)
        self._dbapi_error: type[Exception] = engine.dialect.loaded_dbapi.Error
        self._queued = threading.Condition(threading.Lock())
        self._pending: list[_Entry] = []
        self._thread: threading.Thread | None = None
        self._owner = 0  # the process whose thread that is
        self._closing = False
        self._connection: Any = None
        #: how many calls its users have in hand (arrived, not yet answered): a hint that lets a
        #: batch wait for the ones on their way (see _gather); None: no waiting
        self.calls_in_progress: Callable[[], int] | None = None
        self._last_batch_seconds = 0.0
        self._recent: deque[int] = deque(maxlen=RECENT_BATCHES)  # the last batches' sizes
        self.forget_after_seconds = FORGET_AFTER_SECONDS
        self.gather_max_seconds = GATHER_MAX_SECONDS

    @classmethod
    def for_database(cls, db: Database, on_commit: Callable[[int], None] | None = None) -> Recorder:
        """The recorder of ``db``'s process: its engine, write lock and busy timeout."""
        return cls(db.engine, db.write_lock, db.busy_timeout_seconds, on_commit)

    def run(self, job: Callable[[Batch], T] | None = None, read: Read | None = None) -> T:
        """Run ``job`` in the next group transaction (or, with ``read``, the job that ``read``
        returns, ``read`` run first, outside it); its result once that has committed."""
        entry = _Entry(job, read)
        self._enqueue(entry)
        entry.wait()
        return cast(T, entry.result())

    async def arun(self, job: Callable[[Batch], T] | None = None, read: Read | None = None) -> T:
        """:meth:`run` for a coroutine: the event loop goes on serving meanwhile."""
        entry = _Entry(job, read, asyncio.get_running_loop())
        assert entry.future is not None
        self._enqueue(entry)
        await entry.future
        return cast(T, entry.result())

    def close(self) -> None:
        """Finish the jobs queued, stop the thread, drop the connection."""
        with self._queued:
            self._closing = True
            self._queued.notify()
            thread = self._thread if self._owner == os.getpid() else None
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        self._drop_connection()  # never back to the pool: it was tuned for the recorder

    def _enqueue(self, entry: _Entry) -> None:
        with self._queued:
            if self._owner != os.getpid():  # first use in this process
                self._closing = False
                self._pending.clear()
                self._connection = None  # a parent's connection is not this process's
                self._thread = None
                self._recent.clear()
            elif self._closing:  # nothing would run it: refused, never left waiting
                raise StorageError("the decision could not be recorded: the service is stopping")
            if self._thread is None or not self._thread.is_alive():
                thread = threading.Thread(
                    target=self._serve, name="agentauth-recorder", daemon=True
                )
                thread.start()  # may fail (no thread to be had): then tried again next time
                self._thread, self._owner = thread, os.getpid()
            self._pending.append(entry)
            self._queued.notify()

    def _serve(self) -> None:
        while True:
            with self._queued:
                if not self._pending:
                    idle_since = time.monotonic()
                    while not self._pending:
                        if self._closing:
                            return
                        self._queued.wait()
                    if time.monotonic() - idle_since > self.forget_after_seconds:
                        self._recent.clear()
                self._gather()
                jobs = self._pending[:MAX_BATCH]
                del self._pending[:MAX_BATCH]
                self._recent.append(len(jobs))
            started = time.monotonic()
            try:
                self._commit_batch(jobs)
            except BaseException:  # SystemExit from a job: its batch fails, the thread goes on
                log.exception("a job stopped the recorder's batch; nothing of it was committed")
                self._drop_connection()  # whatever transaction it held goes with it
                for entry in jobs:
                    if not entry.ok and entry.value is None:  # not told yet
                        entry.settle(False, StorageError("the decision could not be recorded"))
            finally:
                _wake(jobs)
            self._last_batch_seconds = time.monotonic() - started

    def _gather(self) -> None:
        """Group commit that grows with the load: when fewer calls are queued than the batch
        expects, wait for them, for at most as long as the last batch took and never more than
        :data:`GATHER_MAX_SECONDS`. It expects the calls the worker has in hand (among them,
        right after a batch, its callers being answered), or as many as the largest of the last
        :data:`RECENT_BATCHES` batches, if more: under a steady load the callers of the last
        batches come straight back, though not yet in hand when the next batch starts. A call
        then waits at most one batch's time more, and a commit (the fsync, the write lock, the
        hand-offs, the key and agent reads) is shared by all the calls of a round instead of
        part of them (bench/RESULTS.md, #21). Alone, a call waits for nothing: it is the only
        one in hand and the batches before it held one each, or none came for
        :data:`FORGET_AFTER_SECONDS`; when the load falls, the expectation falls with it within
        :data:`RECENT_BATCHES` batches. Called holding ``_queued``."""
        if self.calls_in_progress is None:
            return
        recent = max(self._recent, default=0)
        deadline = time.monotonic() + min(self._last_batch_seconds, self.gather_max_seconds)
        while not self._closing and len(self._pending) < min(
            max(self.calls_in_progress(), recent), MAX_BATCH
        ):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._queued.wait(left)

    def _commit_batch(self, entries: list[_Entry]) -> None:
        jobs = self._read(entries)
        results: list[tuple[_Entry, bool, Any]] = []
        try:
            if jobs:
                try:
                    self._locked_transaction(jobs, results)
                except _StaleConnection:  # nothing of the batch was committed: once more, anew
                    log.warning("the database connection was lost; running the batch on a new one")
                    self._drop_connection()
                    self._locked_transaction(jobs, results)
        except BaseException as exc:  # the commit failed: nobody in the batch is acknowledged
            log.error("decision batch of %d could not be committed", len(jobs), exc_info=exc)
            self._drop_connection()
            for entry in jobs:  # every caller waiting on this batch gets its answer first
                entry.settle(False, StorageError("the decision could not be recorded"))
            if not isinstance(exc, Exception):
                raise  # SystemExit, KeyboardInterrupt: the thread says so and goes on
            return
        if self._on_commit is not None and jobs:
            self._on_commit(len(jobs))
        for entry, ok, value in results:
            entry.settle(ok, value)

    def _read(self, entries: list[_Entry]) -> list[_Entry]:
        """Each entry's read phase, outside the write transaction: the entries that have a job
        to run in it. One whose read fails is settled with its error and left out; when the
        connection kept from an earlier batch turns out broken, the reads run once more on a
        new one."""
        reused = self._connection is not None
        jobs, failed = self._read_each(entries)
        if failed and reused and self._connection is None:
            again, failed = self._read_each([entry for entry, _ in failed])
            jobs += again
        for entry, exc in failed:
            entry.settle(False, exc)
        if not jobs and not self._sqlite and self._connection is not None:
            self._rollback(self._connection, None)  # end the reads' transaction: none follows
        return jobs

    def _read_each(
        self, entries: list[_Entry]
    ) -> tuple[list[_Entry], list[tuple[_Entry, Exception]]]:
        jobs: list[_Entry] = []
        failed: list[tuple[_Entry, Exception]] = []
        reads = Reads.for_batch(self._engine, self._connect)
        for entry in entries:
            if entry.read is not None:
                try:
                    entry.job = entry.read(reads)
                except Exception as exc:
                    failed.append((entry, exc))
                    continue
                if entry.job is None:  # read, nothing to write
                    entry.settle(True, None)
                    continue
            jobs.append(entry)
        if reads.broken:
            self._drop_connection()
        return jobs, failed

    def _locked_transaction(self, jobs: list[_Entry], results: list[Any]) -> None:
        if self._write_lock is not None:
            with self._write_lock:
                self._transaction(jobs, results)
        else:
            self._transaction(jobs, results)

    def _transaction(self, jobs: list[_Entry], results: list[Any]) -> None:
        reused = self._connection is not None
        connection = self._connect()
        cursor = connection.cursor()
        committing = False
        try:
            self._begin(cursor)
            if not self._run_together(cursor, jobs, results):
                results.clear()
                self._rollback(connection, cursor)
                self._begin(cursor)
                self._run_apart(cursor, jobs, results)
            committing = True  # from here on, a failure may hide a commit that happened
            if self._sqlite:
                cursor.execute("COMMIT")
            else:
                self._commit_postgresql(connection)
        except BaseException as exc:
            results.clear()
            self._rollback(connection, cursor)
            if reused and not committing and self._is_disconnect(exc, connection, cursor):
                raise _StaleConnection from exc
            raise
        finally:
            cursor.close()

    def _run_together(self, cursor: Any, jobs: list[_Entry], results: list[Any]) -> bool:
        """The common case, in as few driver calls as it takes: no savepoint per job, and the
        audit rows of all jobs in one ``executemany``. False when a job failed after it had
        changed something, or the rows could not all be written: the batch must then run
        again with a savepoint per job, so that only the failing job fails."""
        batch = Batch(cursor, self.statements, deferred=True)
        for entry in jobs:
            before = batch.writes
            try:
                value = cast(Job, entry.job)(batch)
            except Exception as exc:
                if batch.writes != before or isinstance(exc, self._dbapi_error):
                    return False
                results.append((entry, False, exc))  # e.g. its key's budget was spent
            else:
                results.append((entry, True, value))
        try:
            batch.flush()
        except Exception as exc:
            if self._is_disconnect(exc, self._connection, cursor):
                raise
            return False
        return True

    def _run_apart(self, cursor: Any, jobs: list[_Entry], results: list[Any]) -> None:
        batch = Batch(cursor, self.statements, deferred=False)
        for entry in jobs:
            mark = batch.savepoint()
            try:
                value = cast(Job, entry.job)(batch)
            except Exception as exc:  # this job alone fails
                batch.rollback_to(mark)
                if isinstance(exc, self._dbapi_error):  # e.g. its agent was deleted meanwhile
                    log.error("a decision could not be recorded", exc_info=exc)
                    exc = StorageError("the decision could not be recorded")
                results.append((entry, False, exc))
            else:
                batch.release(mark)
                results.append((entry, True, value))
        batch.flush()  # the chains' heads: the rows went in one by one

    @staticmethod
    def _commit_postgresql(connection: Any) -> None:
        """COMMIT, unless a statement failed in the transaction and nothing took the failure up
        (PostgreSQL would then answer a COMMIT with a silent ROLLBACK, and the batch would be
        acknowledged without being recorded)."""
        from psycopg.pq import TransactionStatus

        if connection.driver_connection.info.transaction_status == TransactionStatus.INERROR:
            raise StorageError("a statement of the decision batch failed; nothing was committed")
        connection.commit()

    def _begin(self, cursor: Any) -> None:
        if not self._sqlite:
            return  # psycopg opens the transaction itself
        begin_immediate(cursor.execute, self._lock_wait)  # another process may hold it

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
