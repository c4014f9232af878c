"""Database access: the engine, transactions, and bringing the schema up to date.

SQLite is the embedded default: WAL, ``synchronous=FULL`` (configurable), foreign keys on, a busy
timeout, and ``BEGIN IMMEDIATE`` for write transactions so two writers queue on the lock instead
of failing with "database is locked" after reading. PostgreSQL serves several instances.

Callers use :meth:`Database.transaction` (ORM) or :meth:`Database.connect` (Core); commits
happen there, and for decisions in ``core.hotpath.recorder``, nowhere else. SQLAlchemy errors
are translated into :class:`core.domain.errors.StorageError` at this boundary: during
requests in words fit for an API client; when the database is opened
(:meth:`Database.schema_connection`) with the database's URL and the driver's reason, both
without the password.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from core.config import Settings
from core.domain.errors import ConfigError, StorageError

#: SQLite's primary result codes for "another connection holds the lock" (extended codes such
#: as SQLITE_BUSY_SNAPSHOT share their low byte)
SQLITE_BUSY_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})
#: how often a writer tries again for SQLite's write lock while another process holds it
SQLITE_LOCK_POLL_SECONDS = 0.0002
#: how often a yielding writer (a paced batch of a long write: a prune, an erasure, a fold)
#: tries again: ten times less often than decisions, which so take the lock first
SQLITE_YIELDING_POLL_SECONDS = 0.002

_PG_NETWORK = {
    "connect_timeout": 10,
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
    # data sent and never acknowledged (a query or COMMIT to a vanished host) fails in 30 s,
    # where keepalives do not apply and the kernel would retransmit for about 15 minutes
    "tcp_user_timeout": 30_000,
}


def normalize_url(url: str) -> str:
    """``postgresql://`` and ``postgres://`` mean the psycopg 3 driver."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


class Database:
    """One engine per process (engines must not cross a fork), and its sessions."""

    def __init__(self, settings: Settings) -> None:
        given = _parse_url(settings.database_url)
        parsed = _parse_url(normalize_url(settings.database_url))
        self.is_sqlite = parsed.get_backend_name() == "sqlite"
        if not self.is_sqlite and parsed.get_backend_name() != "postgresql":
            raise ConfigError("the database URL must be sqlite:///... or postgresql://...")
        self._secrets = _secrets_of(given)
        #: the URL as given, for messages: never its password (nor a name that happens to be it)
        self.display_url = self._scrub(_without_password(given))
        #: the file of a SQLite database (None in memory or for a file: URI)
        self.sqlite_path = _sqlite_file(parsed) if self.is_sqlite else None
        self.engine: Engine = create_engine(parsed, **_engine_options(parsed, self.is_sqlite))
        if self.is_sqlite:
            _configure_sqlite(self.engine, settings)
        else:
            _configure_postgresql(self.engine)
        self._write_engine = self.engine.execution_options(sqlite_begin="IMMEDIATE")
        self._yielding_engine = self._write_engine.execution_options(
            sqlite_lock_poll=SQLITE_YIELDING_POLL_SECONDS
        )
        # SQLite has one writer at a time: threads of this process queue on a lock of their own
        # rather than in SQLite's busy handler, which sleeps whole milliseconds between tries
        self.write_lock = threading.Lock() if self.is_sqlite else None
        #: how long a write waits for another process's SQLite write lock
        self.busy_timeout_seconds = settings.sqlite_busy_timeout_ms / 1000
        self._reader = sessionmaker(bind=self.engine, expire_on_commit=False)
        self._writer = sessionmaker(bind=self._write_engine, expire_on_commit=False)
        self._yielding_writer = sessionmaker(bind=self._yielding_engine, expire_on_commit=False)

    @contextmanager
    def transaction(
        self, *, write: bool = False, snapshot: bool = False, yielding: bool = False
    ) -> Iterator[Session]:
        """A session in one transaction: committed when the block ends, rolled back on error.

        ``write=True`` takes SQLite's write lock up front (``BEGIN IMMEDIATE``); with
        ``yielding=True`` too, a batch of a long write tries for it less often than decisions
        do (:data:`SQLITE_YIELDING_POLL_SECONDS`), so that they take it first. ``snapshot=True``
        makes every statement see the same data (PostgreSQL ``REPEATABLE READ``; a SQLite read
        transaction in WAL mode already is a snapshot).
        """
        lock: AbstractContextManager[Any] = (
            self.write_lock if write and self.write_lock else nullcontext()
        )
        with lock:
            yield from self._session(write, snapshot, yielding)

    def _session(self, write: bool, snapshot: bool, yielding: bool) -> Iterator[Session]:
        writer = self._yielding_writer if yielding else self._writer
        session = (writer if write else self._reader)()
        try:
            if snapshot and not self.is_sqlite:
                session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
            yield session
            session.commit()
        except SQLAlchemyError as exc:
            session.rollback()
            raise StorageError(_storage_message(exc)) from exc
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    @contextmanager
    def connect(self, *, write: bool = False, yielding: bool = False) -> Iterator[Connection]:
        """A Core connection in one transaction, where the ORM's unit of work costs more than
        the SQL (the policy cache's loads, the per-key counter). Same commit, rollback and
        error rules as :meth:`transaction`."""
        lock: AbstractContextManager[Any] = (
            self.write_lock if write and self.write_lock else nullcontext()
        )
        with lock:
            try:
                writer = self._yielding_engine if yielding else self._write_engine
                with (writer if write else self.engine).begin() as connection:
                    yield connection
            except SQLAlchemyError as exc:
                raise StorageError(_storage_message(exc)) from exc

    def dispose(self) -> None:
        self.engine.dispose()

    @contextmanager
    def schema_connection(self) -> Iterator[Connection]:
        """A connection, for reading or migrating the schema. StorageError naming the database
        and the driver's reason when it cannot be opened."""
        try:
            connection = self.engine.connect()
        except SQLAlchemyError as exc:
            reason = self.explain(exc) + self._folder_hint()
            raise StorageError(f"cannot open the database {self.display_url}: {reason}") from exc
        with connection:
            yield connection

    def explain(self, exc: BaseException) -> str:
        """Why ``exc`` happened, in the driver's words on one line, the password taken out
        (a driver may quote what it was given)."""
        cause = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
        return self._scrub(" ".join(str(cause).split()) or type(cause).__name__)

    def _scrub(self, message: str) -> str:
        for secret in self._secrets:
            message = message.replace(secret, "***")
        return message

    def _folder_hint(self) -> str:
        """What SQLite's "unable to open database file" leaves unsaid."""
        if self.sqlite_path is None:
            return ""
        folder = self.sqlite_path.absolute().parent
        if not folder.is_dir():
            return f" (the folder {folder} does not exist)"
        if not os.access(folder, os.W_OK):
            return f" (the folder {folder} is not writable)"
        return ""


def _parse_url(url: str) -> URL:
    try:
        return make_url(url)
    except SQLAlchemyError as exc:  # its message does not repeat the URL, nor so its password
        raise ConfigError(f"invalid database URL: {exc}") from None


def _without_password(url: URL) -> str:
    return url.difference_update_query(["password"]).render_as_string(hide_password=True)


def _secrets_of(url: URL) -> list[str]:
    """The password, as given in the URL and as the driver sees it, longest first."""
    given = [url.password, url.query.get("password")]
    passwords = [p for p in given if isinstance(p, str) and p]
    forms = {form for p in passwords for form in (p, quote(p, safe=""))}
    return sorted(forms, key=len, reverse=True)


def _sqlite_file(url: URL) -> Path | None:
    if not url.database or url.database == ":memory:" or url.query.get("uri"):
        return None
    return Path(url.database)


def _engine_options(url: URL, is_sqlite: bool) -> dict[str, Any]:
    # a statement's parameters hold what callers sent (names, descriptions, tool calls): they
    # stay out of the errors SQLAlchemy raises, and so out of every log line
    if is_sqlite:
        return {"pool_pre_ping": False, "hide_parameters": True}
    # a connect to a host that went silent fails in 10 s, and a connection whose peer vanished
    # without a word is found dead within about a minute (keepalives when idle, a 30 s limit
    # on unacknowledged data otherwise), instead of holding a request forever; the URL's own
    # values win
    network = {k: v for k, v in _PG_NETWORK.items() if k not in url.query}
    return {
        "pool_pre_ping": True,
        "pool_size": 5,
        "max_overflow": 10,
        "connect_args": network,
        "hide_parameters": True,
    }


def _storage_message(exc: SQLAlchemyError) -> str:
    """The StorageError message for a failed session or connection: no driver detail, since
    it reaches API clients (operators get the cause chained to it)."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return "the database connection was lost"
    return "the database could not complete the request"


def _configure_sqlite(engine: Engine, settings: Settings) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # the driver must not open transactions of its own: we emit BEGIN ourselves below
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA synchronous={settings.sqlite_synchronous}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={int(settings.sqlite_busy_timeout_ms)}")
        cursor.close()

    busy_timeout_ms = int(settings.sqlite_busy_timeout_ms)

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        options = connection.get_execution_options()
        mode = options.get("sqlite_begin", "")
        # straight to the driver: this runs for every transaction, and going through
        # SQLAlchemy's execution machinery would cost more than the statement
        statement = f"BEGIN {mode}".strip()
        driver = connection.connection.driver_connection
        try:
            if mode != "IMMEDIATE":
                driver.execute(statement)
                return
            # the write lock polled for, not waited for in SQLite's busy handler: that one
            # sleeps longer and longer between tries (up to 100 ms), so a writer of another
            # process that takes the lock again at once (a fold, a prune's batches) kept a
            # deletion's batch waiting 330 ms, and every decision of its process behind it
            driver.execute("PRAGMA busy_timeout=0")
            try:
                poll = options.get("sqlite_lock_poll", SQLITE_LOCK_POLL_SECONDS)
                begin_immediate(driver.execute, busy_timeout_ms / 1000, poll)
            finally:
                driver.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")
        except sqlite3.Error as exc:  # e.g. locked: must reach callers as SQLAlchemy's error
            raise DBAPIError.instance(statement, None, exc, sqlite3.Error) from exc


def begin_immediate(
    execute: Any, wait_seconds: float, poll_seconds: float = SQLITE_LOCK_POLL_SECONDS
) -> None:
    """``BEGIN IMMEDIATE`` through ``execute`` (a SQLite connection's or cursor's, with no busy
    timeout of its own), tried again every ``poll_seconds`` while another connection holds
    the write lock, for at most ``wait_seconds``; then the driver's error."""
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            execute("BEGIN IMMEDIATE")
            return
        except sqlite3.Error as exc:
            busy = (getattr(exc, "sqlite_errorcode", 0) & 0xFF) in SQLITE_BUSY_CODES
            if not busy or time.monotonic() > deadline:
                raise
            time.sleep(poll_seconds)


def _configure_postgresql(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # no JIT compilation: every statement here is a short index walk or a bounded
        # aggregate, and a cost estimated high (a sum over 30 days of rollups) made PostgreSQL
        # spend about 0.9 s compiling one that runs in 0.3 s
        dbapi_connection.execute("SET jit = off")
        dbapi_connection.commit()


def check_connection(db: Database) -> None:
    """Raise StorageError when the database cannot be reached."""
    with db.transaction() as session:
        session.execute(text("SELECT 1"))
