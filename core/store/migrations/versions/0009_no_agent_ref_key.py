"""One index fewer in every decision's commit (issue #32, as 0008): ``audit_log.agent_ref``
loses its index and its foreign key. The column stays (the erasure guard reads it: only an
entry of an agent that existed when it was written can be erased).

What used them reads the agent's index by time instead, ``(workspace_id, agent_id, timestamp,
id)``, which every decision writes anyway: an agent's erasure (its erased entries leave that
index, so each batch finds the next at once) and ``plan``'s replay of its recent calls. The
foreign key checked, at each insert, that the agent existed (the decision had just read it)
and, at an agent's deletion, that none of its entries still named it (erasure clears
``agent_ref`` first, in the same transaction): without its index, the latter would read the
whole log.

On SQLite a foreign key is part of the table's text, and taking it out otherwise means copying
the table (gigabytes, for a long log): the table's text is changed in place, as SQLite's
``ALTER TABLE`` documentation describes for removing a foreign key constraint (the file's
format does not change), and the schema's version moved on so that every other connection
reads it again.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-28
"""

import re

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_INDEX = "ix_audit_log_agent_ref"
_KEY = re.compile(r",\s*FOREIGN KEY\s*\(agent_ref\) REFERENCES agents \(id\)( ON DELETE CASCADE)?")


def upgrade() -> None:
    bind = op.get_bind()
    bind.exec_driver_sql(f"DROP INDEX {_INDEX}")
    if bind.dialect.name == "postgresql":
        name = bind.exec_driver_sql(
            "SELECT conname FROM pg_constraint WHERE conrelid = 'audit_log'::regclass"
            " AND contype = 'f' AND conkey = ARRAY[(SELECT attnum FROM pg_attribute"
            " WHERE attrelid = 'audit_log'::regclass AND attname = 'agent_ref')]::smallint[]"
        ).scalar_one()
        bind.exec_driver_sql(f'ALTER TABLE audit_log DROP CONSTRAINT "{name}"')
        return
    table = bind.exec_driver_sql(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'audit_log'"
    ).scalar_one()
    without, found = _KEY.subn("", table)
    if found != 1:
        raise RuntimeError(f"audit_log's foreign key on agent_ref not found in: {table}")
    _rewrite(bind, without)


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        bind.exec_driver_sql(
            "ALTER TABLE audit_log ADD FOREIGN KEY (agent_ref) REFERENCES agents (id)"
            " ON DELETE CASCADE"
        )
    else:
        table = bind.exec_driver_sql(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'audit_log'"
        ).scalar_one()
        closing = table.rstrip().rindex(")")
        key = ", \n\tFOREIGN KEY(agent_ref) REFERENCES agents (id) ON DELETE CASCADE\n"
        _rewrite(bind, table[:closing].rstrip() + key + ")")
    bind.exec_driver_sql(f"CREATE INDEX {_INDEX} ON audit_log (agent_ref)")


def _rewrite(bind, sql: str) -> None:  # type: ignore[no-untyped-def]
    """audit_log's CREATE TABLE text replaced in SQLite's schema, in this transaction."""
    version = bind.exec_driver_sql("PRAGMA schema_version").scalar_one()
    bind.exec_driver_sql("PRAGMA writable_schema = ON")
    try:
        bind.exec_driver_sql(
            "UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = 'audit_log'",
            (sql,),
        )
        bind.exec_driver_sql(f"PRAGMA schema_version = {int(version) + 1}")
    finally:
        bind.exec_driver_sql("PRAGMA writable_schema = OFF")
