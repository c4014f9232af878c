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


_ERASED_POSTGRES = """NEW.agent_id = '' AND NEW.action = '' AND NEW.tool_name = ''
    AND NEW.parameters = '{}'::jsonb AND NEW.result = '' AND NEW.reason = ''
    AND NEW.latency_ms = 0 AND NEW.key_id IS NULL AND NEW.policy_id IS NULL
    AND NEW.rule_index IS NULL AND NEW.approval_id IS NULL"""


def _postgres_guard(prunable: bool) -> str:
    """0004's guard (the one update allowed: erasure), with, when ``prunable``, the one delete
    allowed: of an entry at or before its workspace's pruned head (archived first)."""
    prune = """IF TG_OP = 'DELETE' AND OLD.seq <= COALESCE(
           (SELECT pruned_seq FROM audit_heads WHERE workspace_id = OLD.workspace_id), 0) THEN
           RETURN OLD;
         END IF;"""
    return f"""CREATE OR REPLACE FUNCTION audit_log_guard() RETURNS trigger LANGUAGE plpgsql AS $$
       BEGIN
         IF TG_OP = 'UPDATE' AND NOT OLD.erased AND NEW.erased AND OLD.agent_ref IS NOT NULL
            AND NEW.agent_ref IS NULL AND NEW.id = OLD.id
            AND NEW.workspace_id = OLD.workspace_id
            AND NEW.seq IS NOT DISTINCT FROM OLD.seq
            AND NEW.entry_hash IS NOT DISTINCT FROM OLD.entry_hash
            AND NEW.hash IS NOT DISTINCT FROM OLD.hash AND NEW.timestamp = OLD.timestamp
            AND {_ERASED_POSTGRES} THEN
           RETURN NEW;
         END IF;
         {prune if prunable else ""}
         RAISE EXCEPTION 'audit_log is append-only' USING ERRCODE = 'integrity_constraint_violation';
       END $$"""


def _sqlite_delete_guard(prunable: bool) -> list[str]:
    when = (
        " WHEN OLD.seq > COALESCE((SELECT pruned_seq FROM audit_heads"
        " WHERE workspace_id = OLD.workspace_id), 0)"
        if prunable
        else ""
    )
    return [
        "DROP TRIGGER audit_log_no_delete",
        f"CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log{when}"
        " BEGIN SELECT RAISE(ABORT, 'audit_log is append-only'); END",
    ]


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
    # retention (decisions §9): where each chain was pruned, and the guards that let exactly the
    # entries up to there be deleted
    op.add_column(
        "audit_heads",
        sa.Column("pruned_seq", sa.BigInteger, nullable=False, server_default=sa.text("0")),
    )
    op.add_column(
        "audit_heads",
        sa.Column("pruned_hash", sa.String(64), nullable=False, server_default="0" * 64),
    )
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        for statement in _sqlite_delete_guard(prunable=True):
            bind.exec_driver_sql(statement)
    else:
        bind.exec_driver_sql(_postgres_guard(prunable=True))
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
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        for statement in _sqlite_delete_guard(prunable=False):
            bind.exec_driver_sql(statement)
    else:
        bind.exec_driver_sql(_postgres_guard(prunable=False))
    with op.batch_alter_table("audit_heads") as batch:
        batch.drop_column("pruned_hash")
        batch.drop_column("pruned_seq")
    op.drop_index("ix_audit_tallies_workspace", table_name="audit_tallies")
    op.drop_table("audit_tallies")
    op.drop_index("ix_audit_workspace_tool_time", table_name="audit_log")
    op.drop_index("ix_audit_counts_bucket", table_name="audit_counts")
    op.drop_table("audit_counts")
