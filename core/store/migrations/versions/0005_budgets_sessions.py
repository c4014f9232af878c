"""Budgets and sessions (decisions §8): counters that hold a budget's sum in units (64-bit) and
say when their window ends (per-session counters go then), and the session an audit entry
names, with the index its filter uses.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":  # SQLite's INTEGER is 64-bit already
        op.alter_column("rate_counters", "count", type_=sa.BigInteger(), existing_nullable=False)
    op.add_column("rate_counters", sa.Column("window_end", sa.BigInteger(), nullable=True))
    op.add_column("audit_log", sa.Column("session_id", sa.String(255), nullable=True))
    op.create_index(
        "ix_audit_workspace_session_time",
        "audit_log",
        ["workspace_id", "session_id", "timestamp", "id"],
    )


def downgrade() -> None:
    op.drop_index("ix_audit_workspace_session_time", table_name="audit_log")
    with op.batch_alter_table("audit_log") as batch:
        batch.drop_column("session_id")
    with op.batch_alter_table("rate_counters") as batch:
        batch.drop_column("window_end")
    if op.get_bind().dialect.name == "postgresql":
        # budgets' sums in units may not fit 32 bits: those counters go (their windows start
        # afresh), the rest narrow
        op.execute("DELETE FROM rate_counters WHERE count > 2147483647")
        op.alter_column("rate_counters", "count", type_=sa.Integer(), existing_nullable=False)
