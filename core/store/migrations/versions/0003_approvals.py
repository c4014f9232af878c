"""Human approval (decisions §6): approvals and who asked for them, the approval an audit entry
names, and webhooks with their outbox of events and deliveries.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(JSONB(), "postgresql")
TS = sa.DateTime(timezone=False)


def upgrade() -> None:
    op.add_column("audit_log", sa.Column("approval_id", sa.String(36), nullable=True))
    op.create_table(
        "approvals",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("workspace_id", sa.String(36), sa.ForeignKey("workspaces.id"), nullable=False),
        sa.Column(
            "agent_id",
            sa.String(36),
            sa.ForeignKey("agents.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("tool_name", sa.String(255), nullable=False),
        sa.Column("parameters", JSON, nullable=False),
        sa.Column("parameters_digest", sa.String(64), nullable=False),
        sa.Column("policy_id", sa.String(36), nullable=False),
        sa.Column("rule_index", sa.Integer, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("expires_at", TS, nullable=False),
        sa.Column("decided_at", TS, nullable=True),
        sa.Column("decided_by_key_id", sa.String(36), nullable=True),
        sa.Column("decided_by_name", sa.String(255), nullable=True),
        sa.Column("comment", sa.Text, nullable=True),
        sa.Column("used_at", TS, nullable=True),
        sa.Column("requested_by_key_id", sa.String(36), nullable=True),
    )
    op.create_index(
        "ix_approvals_call",
        "approvals",
        ["workspace_id", "agent_id", "tool_name", "parameters_digest", "status"],
    )
    op.create_index(
        "ix_approvals_workspace_created", "approvals", ["workspace_id", "created_at", "id"]
    )
    op.create_index("ix_approvals_agent_id", "approvals", ["agent_id"])
    # one pending approval per call: identical calls of several processes reuse it
    op.create_index(
        "ux_approvals_pending_call",
        "approvals",
        ["workspace_id", "agent_id", "tool_name", "parameters_digest"],
        unique=True,
        sqlite_where=sa.text("status = 'pending'"),
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.create_table(
        "approval_requesters",
        sa.Column(
            "approval_id",
            sa.String(36),
            sa.ForeignKey("approvals.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("key_id", sa.String(36), primary_key=True),
    )
    op.create_table(
        "webhooks",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("workspace_id", sa.String(36), sa.ForeignKey("workspaces.id"), nullable=False),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("events", sa.String(255), nullable=False),
        sa.Column("description", sa.Text, nullable=True),
        sa.Column("secret", sa.String(128), nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_index(
        "ix_webhooks_workspace_created", "webhooks", ["workspace_id", "created_at", "id"]
    )
    op.create_table(
        "webhook_events",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("workspace_id", sa.String(36), sa.ForeignKey("workspaces.id"), nullable=False),
        sa.Column("type", sa.String(64), nullable=False),
        sa.Column("payload", JSON, nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column(
            "webhook_id",
            sa.String(36),
            sa.ForeignKey("webhooks.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column(
            "event_id",
            sa.String(36),
            sa.ForeignKey("webhook_events.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("event_type", sa.String(64), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("response_status", sa.Integer, nullable=True),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("next_attempt_at", TS, nullable=True),
        sa.Column("delivered_at", TS, nullable=True),
    )
    op.create_index(
        "ix_webhook_deliveries_webhook_created",
        "webhook_deliveries",
        ["webhook_id", "created_at", "id"],
    )
    op.create_index(
        "ix_webhook_deliveries_due", "webhook_deliveries", ["status", "next_attempt_at"]
    )


def downgrade() -> None:
    raise NotImplementedError("audit entries name their approvals; there is no way back")
