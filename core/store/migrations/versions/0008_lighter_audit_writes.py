"""Fewer index pages written by each decision's commit (issue #32: counts on the hot path
within 5% of authorize's throughput before them). A commit appends every page it changed to
SQLite's WAL (PostgreSQL's likewise), and each index of ``audit_log`` and of ``audit_tallies``
is a page more:

- the index of a session's entries keeps only the entries that have a session (most calls
  have none, and each such entry was a row in it that no read uses: the list and the stats
  filter on ``session_id = :id``, which the partial index serves);
- the tallies lose their index by workspace: the table holds about a second of batches (the
  fold empties it every second), which a read takes whole.

On PostgreSQL the session index is built again over every partition, entries with a session
only: an upgrade of a long log takes that long once.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-28
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_SESSION_INDEX = "ix_audit_workspace_session_time"
_COLUMNS = "workspace_id, session_id, timestamp, id"


def upgrade() -> None:
    bind = op.get_bind()
    bind.exec_driver_sql("DROP INDEX ix_audit_tallies_workspace")
    bind.exec_driver_sql(f"DROP INDEX {_SESSION_INDEX}")
    bind.exec_driver_sql(
        f"CREATE INDEX {_SESSION_INDEX} ON audit_log ({_COLUMNS}) WHERE session_id IS NOT NULL"
    )


def downgrade() -> None:
    bind = op.get_bind()
    bind.exec_driver_sql(f"DROP INDEX {_SESSION_INDEX}")
    bind.exec_driver_sql(f"CREATE INDEX {_SESSION_INDEX} ON audit_log ({_COLUMNS})")
    bind.exec_driver_sql(
        "CREATE INDEX ix_audit_tallies_workspace ON audit_tallies (workspace_id, id)"
    )
