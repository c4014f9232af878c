"""The audit log at scale (decisions §9): the counts kept as entries are committed (per minute
and per hour, by agent, tool, agent and tool, and session, each with result and action; the
batches' tallies not yet folded into them beside), and
an index per filter of the list, so a page and its total never read the whole log.

Counts for the entries already written are made here, from the entries.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

#: (kind, its agent, tool and session columns: the entry's, or "" where the kind keys none)
_KINDS = (
    ("*", "''", "''", "''"),
    ("a", "agent_id", "''", "''"),
    ("t", "''", "tool_name", "''"),
    ("b", "agent_id", "tool_name", "''"),
    ("s", "''", "''", "session_id"),
)


def upgrade() -> None:
    op.create_table(
        "audit_counts",
        sa.Column("workspace_id", sa.String(36), sa.ForeignKey("workspaces.id"), primary_key=True),
        sa.Column("grain", sa.Integer, primary_key=True),
        sa.Column("kind", sa.String(1), primary_key=True),
        sa.Column("agent_id", sa.String(36), primary_key=True),
        sa.Column("tool_name", sa.String(255), primary_key=True),
        sa.Column("session_id", sa.String(255), primary_key=True),
        sa.Column("bucket", sa.BigInteger, primary_key=True),
        sa.Column("result", sa.String(16), primary_key=True),
        sa.Column("action", sa.String(32), primary_key=True),
        sa.Column("count", sa.BigInteger, nullable=False),
    )
    op.create_index(
        "ix_audit_counts_bucket", "audit_counts", ["workspace_id", "grain", "kind", "bucket"]
    )
    op.create_table(
        "audit_tallies",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer, "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("workspace_id", sa.String(36), sa.ForeignKey("workspaces.id"), nullable=False),
        sa.Column("counts", sa.Text, nullable=False),
    )
    op.create_index("ix_audit_tallies_workspace", "audit_tallies", ["workspace_id", "id"])
    # a tool's entries: one of hundreds of tools, too rare to find by walking the time index
    # (a result or an action is common enough: each index costs every decision a write)
    op.create_index(
        "ix_audit_workspace_tool_time", "audit_log", ["workspace_id", "tool_name", "timestamp", "id"]
    )
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        second = "CAST(strftime('%s', timestamp) AS INTEGER)"
    else:
        second = "CAST(FLOOR(EXTRACT(EPOCH FROM timestamp)) AS BIGINT)"
    for grain in (60, 3600):
        bucket = f"({second} / {grain}) * {grain}"
        for kind, agent, tool, session in _KINDS:
            only = " AND session_id IS NOT NULL" if kind == "s" else ""
            keyed = ", ".join(c for c in (agent, tool, session) if c != "''")
            group = f"workspace_id, {keyed + ', ' if keyed else ''}{bucket}, result, action"
            bind.exec_driver_sql(
                "INSERT INTO audit_counts (workspace_id, grain, kind, agent_id, tool_name,"
                " session_id, bucket, result, action, count)"
                f" SELECT workspace_id, {grain}, '{kind}', {agent}, {tool}, {session},"
                f" {bucket}, result, action, COUNT(*) FROM audit_log"
                f" WHERE NOT erased{only}"
                f" GROUP BY {group}"
            )


def downgrade() -> None:
    op.drop_index("ix_audit_tallies_workspace", table_name="audit_tallies")
    op.drop_table("audit_tallies")
    op.drop_index("ix_audit_workspace_tool_time", table_name="audit_log")
    op.drop_index("ix_audit_counts_bucket", table_name="audit_counts")
    op.drop_table("audit_counts")
