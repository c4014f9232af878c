"""The audit log kept at scale (decisions §9): on PostgreSQL, ``audit_log`` partitioned by
UTC day of its ``timestamp`` (``core.store.partitions``), so that a prune drops whole days; and
the per-minute counts of an agent and tool, and of a session, no longer kept (about one row an
entry: their partial hours are counted from the entries, ``core.domain.auditcounts``).

On PostgreSQL the entries are copied into the partitioned table, which keeps every column,
index, foreign key and guard of the old one but one: the uniqueness of ``(workspace_id, seq)``,
which a partitioned table can only hold per partition (it cannot hold a unique key without the
partition column). The chain's head row, locked by every batch that extends it, is what keeps
a seq from being taken twice; the index stays, not unique.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-28
"""

from datetime import UTC, datetime, timedelta

from alembic import op

from core.store import partitions

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_INDEXES = {
    "ix_audit_workspace_time": "workspace_id, timestamp, id",
    "ix_audit_workspace_agent_time": "workspace_id, agent_id, timestamp, id",
    "ix_audit_workspace_session_time": "workspace_id, session_id, timestamp, id",
    "ix_audit_workspace_tool_time": "workspace_id, tool_name, timestamp, id",
    "ix_audit_log_agent_ref": "agent_ref",
}


def upgrade() -> None:
    bind = op.get_bind()
    bind.exec_driver_sql("DELETE FROM audit_counts WHERE grain = 60 AND kind IN ('b', 's')")
    if bind.dialect.name == "postgresql":
        _partition(bind)


def _partition(bind) -> None:  # type: ignore[no-untyped-def]
    old = "audit_log_unpartitioned"
    bind.exec_driver_sql(f"ALTER TABLE audit_log RENAME TO {old}")
    bind.exec_driver_sql(f"ALTER TABLE {old} RENAME CONSTRAINT audit_log_pkey TO {old}_pkey")
    for name in (*_INDEXES, "ux_audit_workspace_seq"):
        bind.exec_driver_sql(f"ALTER INDEX {name} RENAME TO {name}_unpartitioned")
    bind.exec_driver_sql(
        f"CREATE TABLE audit_log (LIKE {old} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
        ' PARTITION BY RANGE ("timestamp")'
    )
    bind.exec_driver_sql('ALTER TABLE audit_log ADD PRIMARY KEY (id, "timestamp")')
    bind.exec_driver_sql(
        "ALTER TABLE audit_log ADD FOREIGN KEY (workspace_id) REFERENCES workspaces (id)"
    )
    bind.exec_driver_sql(
        "ALTER TABLE audit_log ADD FOREIGN KEY (agent_ref) REFERENCES agents (id)"
        " ON DELETE CASCADE"
    )
    for name, columns in {**_INDEXES, "ix_audit_workspace_seq": "workspace_id, seq"}.items():
        bind.exec_driver_sql(f"CREATE INDEX {name} ON audit_log ({columns})")
    bind.exec_driver_sql(f"CREATE TABLE {partitions.DEFAULT} PARTITION OF audit_log DEFAULT")
    first = bind.exec_driver_sql(f'SELECT min("timestamp") FROM {old}').scalar()
    today = datetime.now(UTC).date()
    start = min(first.date(), today) if first is not None else today
    count = (today - start).days + partitions.AHEAD_DAYS + 1
    partitions.create(bind, [partitions.day_of(start + timedelta(days=n)) for n in range(count)])
    bind.exec_driver_sql(f"INSERT INTO audit_log SELECT * FROM {old}")
    bind.exec_driver_sql(f"DROP TABLE {old}")
    bind.exec_driver_sql(
        "CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log"
        " FOR EACH ROW EXECUTE FUNCTION audit_log_guard()"
    )
    bind.exec_driver_sql(
        "CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log"
        " FOR EACH STATEMENT EXECUTE FUNCTION audit_log_no_truncate()"
    )


def downgrade() -> None:
    raise NotImplementedError("the audit log is append-only; there is no way back")
