"""The verifiable audit log (decisions §7): ``seq``, ``entry_hash`` and ``hash`` on every entry,
each workspace's chain head, and erasure in place of deletion.

Entries written before this revision get their ``seq`` and ``hash`` here, in timestamp-then-id
order, workspace by workspace. The append-only guards change with it: an entry may no longer be
deleted at all (deleting an agent erases its entries' content instead and keeps their chain
leaves), and the one update allowed is that erasure.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25
"""

from datetime import UTC
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

from core.domain.auditchain import ZERO_HASH, chain_hash, entry_hash
from core.domain.clock import isoformat

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(JSONB(), "postgresql")
TS = sa.DateTime(timezone=False)
BATCH = 2000

#: what an erased entry holds besides its id, workspace, time and chain leaf (also in
#: core/store/audit.py's ERASED, which writes it)
_ERASED_SQLITE = """NEW.agent_id = '' AND NEW.action = '' AND NEW.tool_name = ''
    AND NEW.parameters = '{}' AND NEW.result = '' AND NEW.reason = '' AND NEW.latency_ms = 0
    AND NEW.key_id IS NULL AND NEW.policy_id IS NULL AND NEW.rule_index IS NULL
    AND NEW.approval_id IS NULL"""
_ERASED_POSTGRES = _ERASED_SQLITE.replace("'{}'", "'{}'::jsonb")

SQLITE_GUARDS = [
    "DROP TRIGGER audit_log_no_update",
    "DROP TRIGGER audit_log_no_delete",
    # the one update allowed: erasing an entry of an agent, keeping its place in the chain
    f"""CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log
       WHEN NOT (OLD.erased = 0 AND NEW.erased = 1 AND OLD.agent_ref IS NOT NULL
         AND NEW.agent_ref IS NULL AND NEW.id = OLD.id AND NEW.workspace_id = OLD.workspace_id
         AND NEW.seq IS OLD.seq AND NEW.entry_hash IS OLD.entry_hash AND NEW.hash IS OLD.hash
         AND NEW.timestamp IS OLD.timestamp AND {_ERASED_SQLITE})
       BEGIN SELECT RAISE(ABORT, 'audit_log is append-only'); END""",
    """CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log
       BEGIN SELECT RAISE(ABORT, 'audit_log is append-only'); END""",
]

POSTGRES_GUARDS = [
    f"""CREATE OR REPLACE FUNCTION audit_log_guard() RETURNS trigger LANGUAGE plpgsql AS $$
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
         RAISE EXCEPTION 'audit_log is append-only' USING ERRCODE = 'integrity_constraint_violation';
       END $$""",
]


def upgrade() -> None:
    bind = op.get_bind()
    sqlite = bind.dialect.name == "sqlite"
    op.add_column("audit_log", sa.Column("seq", sa.BigInteger, nullable=True))
    op.add_column("audit_log", sa.Column("entry_hash", sa.String(64), nullable=True))
    op.add_column("audit_log", sa.Column("hash", sa.String(64), nullable=True))
    op.add_column(
        "audit_log",
        sa.Column("erased", sa.Boolean, nullable=False, server_default=sa.false()),
    )
    op.create_table(
        "audit_heads",
        sa.Column(
            "workspace_id", sa.String(36), sa.ForeignKey("workspaces.id"), primary_key=True
        ),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
    )
    if sqlite:  # the old guard refuses every update, the backfill's too
        bind.exec_driver_sql("DROP TRIGGER audit_log_no_update")
        bind.exec_driver_sql(
            "CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log"
            " WHEN OLD.seq IS NOT NULL"
            " BEGIN SELECT RAISE(ABORT, 'audit_log is append-only'); END"
        )
    else:
        bind.exec_driver_sql("ALTER TABLE audit_log DISABLE TRIGGER audit_log_append_only")
    _backfill(bind)
    if sqlite:
        for statement in SQLITE_GUARDS:
            bind.exec_driver_sql(statement)
    else:
        for column in ("seq", "entry_hash", "hash"):
            op.alter_column("audit_log", column, nullable=False)
        for statement in POSTGRES_GUARDS:
            bind.exec_driver_sql(statement)
        bind.exec_driver_sql("ALTER TABLE audit_log ENABLE TRIGGER audit_log_append_only")
    op.create_index("ux_audit_workspace_seq", "audit_log", ["workspace_id", "seq"], unique=True)


def _backfill(bind: Any) -> None:
    """Each workspace's entries, oldest first (timestamp, then id), chained from seq 1."""
    log = sa.table(
        "audit_log",
        *(
            sa.column(name, kind)
            for name, kind in (
                ("id", sa.String()),
                ("workspace_id", sa.String()),
                ("agent_id", sa.String()),
                ("action", sa.String()),
                ("tool_name", sa.String()),
                ("parameters", JSON),
                ("result", sa.String()),
                ("policy_id", sa.String()),
                ("approval_id", sa.String()),
                ("reason", sa.String()),
                ("latency_ms", sa.Float()),
                ("timestamp", TS),
                ("seq", sa.BigInteger()),
                ("entry_hash", sa.String()),
                ("hash", sa.String()),
            )
        ),
    )
    heads = sa.table(
        "audit_heads", sa.column("workspace_id"), sa.column("seq"), sa.column("hash")
    )
    update = (
        log.update()
        .where(log.c.id == sa.bindparam("entry_id"))
        .values(
            seq=sa.bindparam("new_seq"),
            entry_hash=sa.bindparam("new_entry_hash"),
            hash=sa.bindparam("new_hash"),
        )
    )
    workspaces = [row[0] for row in bind.execute(sa.text("SELECT id FROM workspaces"))]
    for workspace_id in workspaces:
        seq, head = 0, ZERO_HASH
        after: tuple[Any, str] | None = None
        while True:  # keyset pages: the updates must not disturb the reading
            query = sa.select(log).where(log.c.workspace_id == workspace_id)
            if after is not None:
                query = query.where(sa.tuple_(log.c.timestamp, log.c.id) > after)
            rows = bind.execute(query.order_by(log.c.timestamp, log.c.id).limit(BATCH)).all()
            if not rows:
                break
            changes = []
            for row in rows:
                seq += 1
                own = entry_hash(
                    {
                        "id": row.id,
                        "seq": seq,
                        "agentId": row.agent_id,
                        "action": row.action,
                        "toolName": row.tool_name,
                        "parameters": row.parameters,
                        "result": row.result,
                        "policyId": row.policy_id,
                        "approvalId": row.approval_id,
                        "sessionId": None,
                        "reason": row.reason,
                        "latencyMs": row.latency_ms,
                        "timestamp": isoformat(row.timestamp.replace(tzinfo=UTC)),
                    }
                )
                head = chain_hash(head, own)
                changes.append(
                    {
                        "entry_id": row.id,
                        "new_seq": seq,
                        "new_entry_hash": own.hex(),
                        "new_hash": head.hex(),
                    }
                )
            bind.execute(update, changes)
            after = (rows[-1].timestamp, rows[-1].id)
        bind.execute(heads.insert().values(workspace_id=workspace_id, seq=seq, hash=head.hex()))


def downgrade() -> None:
    raise NotImplementedError("the audit log is append-only; there is no way back")
