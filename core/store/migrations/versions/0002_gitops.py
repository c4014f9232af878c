"""GitOps: what the controller last wrote to each managed object (for drift detection), and
the sync status of each workspace (last attempted and last applied revision).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(JSONB(), "postgresql")
TS = sa.DateTime(timezone=False)


def upgrade() -> None:
    op.add_column("agents", sa.Column("managed_spec", JSON, nullable=True))
    op.add_column("policies", sa.Column("managed_spec", JSON, nullable=True))
    op.create_table(
        "sync_status",
        sa.Column("workspace_id", sa.String(36), sa.ForeignKey("workspaces.id"), primary_key=True),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("attempted_revision", sa.String(200), nullable=False),
        sa.Column("attempted_at", TS, nullable=False),
        sa.Column("result", sa.String(16), nullable=False),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("changes", JSON, nullable=True),
        sa.Column("inventory", JSON, nullable=True),
        sa.Column("applied_revision", sa.String(200), nullable=True),
        sa.Column("applied_at", TS, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("sync_status")
    op.drop_column("policies", "managed_spec")
    op.drop_column("agents", "managed_spec")
