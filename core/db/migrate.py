"""Bringing a database's schema up to date with Alembic, from code (``agentauth db upgrade``,
``agentauth serve``) rather than from an ``alembic.ini``."""

from __future__ import annotations

from functools import cache

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from core.db import Database
from core.errors import StorageError

#: any fixed number: PostgreSQL instances starting together take turns migrating
_ADVISORY_LOCK = 7_041_973_202


def _config() -> Config:
    config = Config()
    config.set_main_option("script_location", "core.db:migrations")
    return config


def upgrade(db: Database, revision: str = "head") -> None:
    """Apply every pending migration (idempotent)."""
    config = _config()
    try:
        with db.engine.begin() as connection:
            if not db.is_sqlite:
                connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _ADVISORY_LOCK})
            config.attributes["connection"] = connection
            command.upgrade(config, revision)
    except SQLAlchemyError as exc:
        raise StorageError(f"database migration failed: {exc.__class__.__name__}") from exc


def is_current(db: Database) -> bool:
    """Whether the schema is at the newest migration; StorageError when the database cannot
    be asked."""
    try:
        with db.engine.connect() as connection:
            current = MigrationContext.configure(connection).get_current_revision()
    except SQLAlchemyError as exc:
        raise StorageError(f"the database cannot be reached: {exc.__class__.__name__}") from exc
    return current == head_revision()


@cache
def head_revision() -> str | None:
    """The newest migration this code knows (read from the migration scripts once)."""
    return ScriptDirectory.from_config(_config()).get_current_head()
