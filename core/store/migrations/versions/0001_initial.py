"""Workspaces, API keys, agents, policies, the append-only audit log and rate counters.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

from core.domain.ids import workspace_id

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(JSONB(), "postgresql")
TS = sa.DateTime(timezone=False)

SQLITE_GUARDS = [
    """CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log
       BEGIN SELECT RAISE(ABORT, 'audit_log is append-only'); END""",
    # the only deletion allowed is the cascade from deleting the entry's agent: by then the
    # agent row is gone
    """CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log
       WHEN OLD.agent_ref IS NULL OR EXISTS (SELECT 1 FROM agents WHERE id = OLD.agent_ref)
       BEGIN SELECT RAISE(ABORT, 'audit_log is append-only'); END""",
]

POSTGRES_GUARDS = [
    """CREATE FUNCTION audit_log_guard() RETURNS trigger LANGUAGE plpgsql AS $$
       BEGIN
         IF TG_OP = 'DELETE' AND OLD.agent_ref IS NOT NULL
            AND NOT EXISTS (SELECT 1 FROM agents WHERE id = OLD.agent_ref) THEN
           RETURN OLD;
         END IF;
         RAISE EXCEPTION 'audit_log is append-only' USING ERRCODE = 'integrity_constraint_violation';
       END $$""",
    """CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log
       FOR EACH ROW EXECUTE FUNCTION audit_log_guard()""",
    """CREATE FUNCTION audit_log_no_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
       BEGIN
         RAISE EXCEPTION 'audit_log is append-only' USING ERRCODE = 'integrity_constraint_violation';
       END $$""",
    """CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
       FOR EACH STATEMENT EXECUTE FUNCTION audit_log_no_truncate()""",
]


def upgrade() -> None:
    workspaces = op.create_table(
        "workspaces",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("name", sa.String(255), nullable=False, unique=True),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("workspace_id", sa.String(36), sa.ForeignKey("workspaces.id"), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("scopes", sa.String(64), nullable=False),
        sa.Column("expires_at", TS, nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("revoked_at", TS, nullable=True),
    )
    op.create_index("ix_api_keys_workspace_id", "api_keys", ["workspace_id"])
    op.create_table(
        "agents",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("workspace_id", sa.String(36), sa.ForeignKey("workspaces.id"), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("description", sa.Text, nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("managed_by", sa.String(16), nullable=True),
        sa.Column("policy_version", sa.Integer, nullable=False, server_default="0"),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
    )
    op.create_index("ix_agents_workspace_created", "agents", ["workspace_id", "created_at", "id"])
    op.create_table(
        "policies",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("workspace_id", sa.String(36), sa.ForeignKey("workspaces.id"), nullable=False),
        sa.Column(
            "agent_id",
            sa.String(36),
            sa.ForeignKey("agents.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("rules", JSON, nullable=False),
        sa.Column("priority", sa.Integer, nullable=False),
        sa.Column("enabled", sa.Boolean, nullable=False),
        sa.Column("managed_by", sa.String(16), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
    )
    op.create_index("ix_policies_agent_id", "policies", ["agent_id"])
    op.create_index(
        "ix_policies_workspace_created", "policies", ["workspace_id", "created_at", "id"]
    )
    op.create_table(
        "audit_log",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("workspace_id", sa.String(36), sa.ForeignKey("workspaces.id"), nullable=False),
        sa.Column("agent_id", sa.String(36), nullable=False),
        sa.Column(
            "agent_ref",
            sa.String(36),
            sa.ForeignKey("agents.id", ondelete="CASCADE"),
            nullable=True,
        ),
        sa.Column("key_id", sa.String(36), nullable=True),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("tool_name", sa.String(255), nullable=False),
        sa.Column("parameters", JSON, nullable=False),
        sa.Column("result", sa.String(16), nullable=False),
        sa.Column("policy_id", sa.String(36), nullable=True),
        sa.Column("rule_index", sa.Integer, nullable=True),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("latency_ms", sa.Float, nullable=False),
        sa.Column("timestamp", TS, nullable=False),
    )
    op.create_index("ix_audit_log_agent_ref", "audit_log", ["agent_ref"])
    op.create_index("ix_audit_workspace_time", "audit_log", ["workspace_id", "timestamp", "id"])
    op.create_index(
        "ix_audit_workspace_agent_time",
        "audit_log",
        ["workspace_id", "agent_id", "timestamp", "id"],
    )
    op.create_table(
        "rate_counters",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("window_start", sa.BigInteger, nullable=False),
        sa.Column("count", sa.Integer, nullable=False),
    )
    guards = SQLITE_GUARDS if op.get_bind().dialect.name == "sqlite" else POSTGRES_GUARDS
    for statement in guards:
        op.execute(statement)
    op.bulk_insert(
        workspaces,
        [{"id": workspace_id("default"), "name": "default", "created_at": _now()}],
    )


def _now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def downgrade() -> None:
    raise NotImplementedError("the audit log is append-only; there is no way back")
