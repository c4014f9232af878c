"""Shadow and warn modes (decisions §10): a policy's ``mode``, and the would-be decision on the
audit entry, in the hash chain from here on.

- ``policies.mode``: ``enforce`` (every policy so far), ``warn`` or ``shadow``.
- ``audit_log.hash_version``: which field set an entry's ``entry_hash`` covers. Every entry so
  far keeps 1 (the v1 fields); entries written from now on carry 2 (the v1 fields and
  ``wouldBe``).
- ``audit_log.would_result``, ``would_policy_id``, ``would_rule_index``, ``would_reason``: the
  would-be decision (``wouldBe``), null when the agent had no ``warn`` or ``shadow`` policy.
- an index of the entries whose would-be decision a policy made and that differs from the
  real one (the shadow report's newest samples): only those entries are in it, so a decision
  without one writes no page of it.

Adding a nullable column or one with a constant default rewrites no row on either store
(PostgreSQL 11 and later keep the default in the catalog), so the upgrade of a long log is
quick; the index starts empty.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_CHANGED_INDEX = "ix_audit_would_changed"
#: the entries a policy's would-be decision changed (the same text as the model's, which the
#: report's query repeats so that the index serves it)
CHANGED = "would_policy_id IS NOT NULL AND would_result <> result"  # models.WOULD_CHANGED


def upgrade() -> None:
    op.add_column(
        "policies",
        sa.Column("mode", sa.String(8), nullable=False, server_default="enforce"),
    )
    op.add_column(
        "audit_log",
        sa.Column("hash_version", sa.SmallInteger, nullable=False, server_default=sa.text("1")),
    )
    op.add_column("audit_log", sa.Column("would_result", sa.String(16), nullable=True))
    op.add_column("audit_log", sa.Column("would_policy_id", sa.String(36), nullable=True))
    op.add_column("audit_log", sa.Column("would_rule_index", sa.Integer, nullable=True))
    op.add_column("audit_log", sa.Column("would_reason", sa.Text, nullable=True))
    op.get_bind().exec_driver_sql(
        f"CREATE INDEX {_CHANGED_INDEX} ON audit_log (workspace_id, would_policy_id, seq)"
        f" WHERE {CHANGED}"
    )


def downgrade() -> None:
    op.get_bind().exec_driver_sql(f"DROP INDEX {_CHANGED_INDEX}")
    with op.batch_alter_table("audit_log") as batch:
        for column in ("would_reason", "would_rule_index", "would_policy_id", "would_result"):
            batch.drop_column(column)
        batch.drop_column("hash_version")
    with op.batch_alter_table("policies") as batch:
        batch.drop_column("mode")
