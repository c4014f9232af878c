"""Alembic environment: always run from code with a connection handed in (see migrate.py)."""

from __future__ import annotations

from alembic import context

from core.store.models import Base

connection = context.config.attributes.get("connection")
if connection is None:  # pragma: no cover - only reached by a bare `alembic` command
    raise SystemExit("run migrations with `agentauth db upgrade`")

context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
