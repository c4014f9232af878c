"""Bringing a database's schema up to date with Alembic, from code (``agentauth db upgrade``,
``agentauth serve``, every verb that writes) rather than from an ``alembic.ini``; and refusing,
for the verbs that only read, a database that is missing or whose schema is not this code's.

Each failure is a :class:`core.domain.errors.StorageError` that names the database (without its
password), says why, and says what to do.
"""

from __future__ import annotations

from functools import cache

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Connection, text
from sqlalchemy.exc import SQLAlchemyError

from core.config import Settings
from core.domain.errors import StorageError
from core.store.database import Database

#: any fixed number: PostgreSQL instances starting together take turns migrating
_ADVISORY_LOCK = 7_041_973_202
#: SQLite's auto_vacuum mode that frees pages when asked (PRAGMA incremental_vacuum)
_INCREMENTAL = 2


def _config() -> Config:
    config = Config()
    config.set_main_option("script_location", "core.store:migrations")
    return config


def upgrade(db: Database, revision: str = "head") -> None:
    """Apply every pending migration (idempotent); a SQLite file that does not exist is
    created."""
    config = _config()
    with db.schema_connection() as connection:
        try:
            if db.is_sqlite:
                _incremental_vacuum(connection)
            with connection.begin():
                if not db.is_sqlite:
                    connection.execute(
                        text("SELECT pg_advisory_xact_lock(:k)"), {"k": _ADVISORY_LOCK}
                    )
                _refuse_unknown(db, _revision_of(connection))
                config.attributes["connection"] = connection
                command.upgrade(config, revision)
        except (SQLAlchemyError, CommandError) as exc:
            raise StorageError(
                f"cannot migrate the database {db.display_url}: {db.explain(exc)}"
            ) from exc


def _incremental_vacuum(connection: Connection) -> None:
    """A SQLite file keeps the pages its deleted rows held, for new rows; a prune gives them
    back to the file system a step at a time (``core.store.retention``), which needs
    ``auto_vacuum=INCREMENTAL``, which takes one ``VACUUM`` to set (it rewrites the file:
    once, at the upgrade that brings prunes; a new file has nothing to rewrite)."""
    # straight to the driver, out of any transaction (VACUUM cannot run in one)
    driver = connection.connection.driver_connection
    assert driver is not None
    if driver.execute("PRAGMA auto_vacuum").fetchone()[0] == _INCREMENTAL:
        return
    driver.execute(f"PRAGMA auto_vacuum = {_INCREMENTAL}")
    driver.execute("VACUUM")


def require_current(db: Database) -> None:
    """For the verbs that only read: StorageError unless the database exists and its schema is
    the newest this code knows. Creates nothing (not even a SQLite file)."""
    if db.sqlite_path is not None and not db.sqlite_path.exists():
        raise StorageError(f"the database {db.display_url} does not exist; {_remedy(db)}")
    current = current_revision(db)
    if current is None:
        raise StorageError(f"the database {db.display_url} has no agentauth schema; {_remedy(db)}")
    _refuse_unknown(db, current)
    if current != head_revision():
        raise StorageError(
            f"the database {db.display_url} has schema revision {current}, this version of"
            f" agentauth needs {head_revision()}; {_remedy(db)}"
        )


def is_current(db: Database) -> bool:
    """Whether the schema is at the newest migration; StorageError when the database cannot
    be asked."""
    return current_revision(db) == head_revision()


def current_revision(db: Database) -> str | None:
    """The schema revision the database is at (None: never migrated)."""
    with db.schema_connection() as connection:
        try:
            return _revision_of(connection)
        except SQLAlchemyError as exc:
            raise StorageError(
                f"cannot read the schema of the database {db.display_url}: {db.explain(exc)}"
            ) from exc


def _revision_of(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


def _refuse_unknown(db: Database, current: str | None) -> None:
    """A revision this code has no migration for was written by a newer agentauth: neither
    reading nor migrating can be trusted."""
    if current is not None and current not in known_revisions():
        raise StorageError(
            f"the database {db.display_url} has schema revision {current}, which this version"
            f" of agentauth does not know (it needs {head_revision()}): upgrade agentauth"
        )


def _remedy(db: Database) -> str:
    return f"run: agentauth db upgrade --db {db.display_url}"


@cache
def head_revision() -> str | None:
    """The newest migration this code knows (read from the migration scripts once)."""
    return ScriptDirectory.from_config(_config()).get_current_head()


@cache
def known_revisions() -> frozenset[str]:
    """Every migration this code has."""
    return frozenset(s.revision for s in ScriptDirectory.from_config(_config()).walk_revisions())


def open_database(settings: Settings, *, write: bool) -> Database:
    """The database of a command, ready for it: one that writes gets it created and migrated;
    one that only reads gets StorageError for a database that is missing or not migrated, and
    nothing is created. Failures name the database (never its password) and say why."""
    database = Database(settings)
    try:
        (upgrade if write else require_current)(database)
    except StorageError:
        database.dispose()
        raise
    return database
