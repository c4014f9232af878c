"""The tables, as typed SQLAlchemy 2.0 models. Migrations in ``migrations/`` create them.

Workspaces own everything. Deleting an agent cascades to its policies and erases its audit
entries' content (``core.store.audit.erase``: each keeps its place in the chain); the audit
table is otherwise append-only, enforced by database triggers created in the migrations.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    SmallInteger,
    String,
    Text,
    false,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

JSONType = JSON().with_variant(JSONB(), "postgresql")


class UTCDateTime(TypeDecorator[datetime]):
    """Stored as naive UTC (portable across SQLite and PostgreSQL), returned as aware UTC."""

    impl = DateTime(timezone=False)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


class Base(DeclarativeBase):
    type_annotation_map = {datetime: UTCDateTime, dict[str, Any]: JSONType}


class Workspace(Base):
    __tablename__ = "workspaces"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    created_at: Mapped[datetime]


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    workspace_id: Mapped[str] = mapped_column(ForeignKey("workspaces.id"), index=True)
    name: Mapped[str] = mapped_column(String(255))
    prefix: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    scopes: Mapped[str] = mapped_column(String(64))  # comma-separated, sorted
    expires_at: Mapped[datetime | None]
    created_at: Mapped[datetime]
    revoked_at: Mapped[datetime | None]


class Agent(Base):
    __tablename__ = "agents"
    __table_args__ = (Index("ix_agents_workspace_created", "workspace_id", "created_at", "id"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    workspace_id: Mapped[str] = mapped_column(ForeignKey("workspaces.id"))
    name: Mapped[str] = mapped_column(String(255))
    description: Mapped[str | None] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16))
    managed_by: Mapped[str | None] = mapped_column(String(16))
    # what the controller last wrote (the managed fields only), to tell drift from repo changes
    managed_spec: Mapped[Any] = mapped_column(JSONType, nullable=True)
    # bumped in the same transaction as any change to the agent's policies, so every process
    # can tell from the agent row alone whether its compiled policies are current
    policy_version: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class Policy(Base):
    __tablename__ = "policies"
    __table_args__ = (Index("ix_policies_workspace_created", "workspace_id", "created_at", "id"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    workspace_id: Mapped[str] = mapped_column(ForeignKey("workspaces.id"))
    agent_id: Mapped[str] = mapped_column(ForeignKey("agents.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(255))
    rules: Mapped[Any] = mapped_column(JSONType)
    priority: Mapped[int] = mapped_column(Integer)
    enabled: Mapped[bool]
    #: "enforce", "warn" or "shadow" (decisions §10; migration 0010)
    mode: Mapped[str] = mapped_column(String(8), server_default="enforce")
    managed_by: Mapped[str | None] = mapped_column(String(16))
    managed_spec: Mapped[Any] = mapped_column(JSONType, nullable=True)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


#: the entries whose would-be decision a policy made and that differs from the real one (the
#: shadow report's samples, through their own partial index)
WOULD_CHANGED = "would_policy_id IS NOT NULL AND would_result <> result"


class AuditEntry(Base):
    """One decision. ``agent_id`` is what the caller asked about (possibly no agent at all);
    ``agent_ref`` is the agent's id when it existed (deleting it erases the entry). On
    PostgreSQL the table is partitioned by day of ``timestamp`` (migration 0007,
    ``core.store.partitions``): its primary key there is ``(id, timestamp)`` and its
    ``(workspace_id, seq)`` index is not unique (the chain's locked head row keeps seqs
    apart)."""

    __tablename__ = "audit_log"
    __table_args__ = (
        Index("ix_audit_workspace_time", "workspace_id", "timestamp", "id"),
        Index("ix_audit_workspace_agent_time", "workspace_id", "agent_id", "timestamp", "id"),
        Index("ux_audit_workspace_seq", "workspace_id", "seq", unique=True),
        # only the entries with a session (migration 0008)
        Index(
            "ix_audit_workspace_session_time",
            "workspace_id",
            "session_id",
            "timestamp",
            "id",
            sqlite_where=text("session_id IS NOT NULL"),
            postgresql_where=text("session_id IS NOT NULL"),
        ),
        Index("ix_audit_workspace_tool_time", "workspace_id", "tool_name", "timestamp", "id"),
        # only the entries whose would-be decision a policy made and changed (migration 0010)
        Index(
            "ix_audit_would_changed",
            "workspace_id",
            "would_policy_id",
            "seq",
            sqlite_where=text(WOULD_CHANGED),
            postgresql_where=text(WOULD_CHANGED),
        ),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    workspace_id: Mapped[str] = mapped_column(ForeignKey("workspaces.id"))
    agent_id: Mapped[str] = mapped_column(String(36))
    #: the agent's id when it existed at the call, else None: only such an entry can be erased
    #: (no index, no foreign key: migration 0009)
    agent_ref: Mapped[str | None] = mapped_column(String(36))
    key_id: Mapped[str | None] = mapped_column(String(36))
    action: Mapped[str] = mapped_column(String(32))
    tool_name: Mapped[str] = mapped_column(String(255))
    parameters: Mapped[Any] = mapped_column(JSONType)
    result: Mapped[str] = mapped_column(String(16))
    policy_id: Mapped[str | None] = mapped_column(String(36))
    rule_index: Mapped[int | None] = mapped_column(Integer)
    reason: Mapped[str] = mapped_column(Text)
    latency_ms: Mapped[float] = mapped_column(Float)
    timestamp: Mapped[datetime]
    approval_id: Mapped[str | None] = mapped_column(String(36))
    session_id: Mapped[str | None] = mapped_column(String(255))
    #: the field set ``entry_hash`` covers: 1 (entries before decisions §10) or 2 (``wouldBe``
    #: too)
    hash_version: Mapped[int] = mapped_column(SmallInteger, server_default=text("1"))
    #: the would-be decision (decisions §10), all null when the agent had no warn or shadow
    #: policy: its result (allowed, denied, escalated or error), the policy and rule that
    #: made it (null for the default deny and for an error) and its reason
    would_result: Mapped[str | None] = mapped_column(String(16))
    would_policy_id: Mapped[str | None] = mapped_column(String(36))
    would_rule_index: Mapped[int | None] = mapped_column(Integer)
    would_reason: Mapped[str | None] = mapped_column(Text)
    #: its place in the workspace's chain (decisions §7): 1, 2, 3, ... in commit order
    seq: Mapped[int] = mapped_column(BigInteger)
    #: SHA-256 of the entry's v1 fields in RFC 8785 canonical JSON, lowercase hex
    entry_hash: Mapped[str] = mapped_column(String(64))
    #: SHA-256(hash(seq - 1) || entry_hash), lowercase hex
    hash: Mapped[str] = mapped_column(String(64))
    #: its agent was deleted: the content is gone, seq, entry_hash and hash stay
    erased: Mapped[bool] = mapped_column(server_default=false())


class AuditHead(Base):
    """The newest seq and hash of a workspace's chain; its row is locked by each batch that
    extends the chain, so several processes never fork it."""

    __tablename__ = "audit_heads"

    workspace_id: Mapped[str] = mapped_column(ForeignKey("workspaces.id"), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger)
    hash: Mapped[str] = mapped_column(String(64))
    #: the entries up to this seq were archived and pruned (decisions §9); the chain goes on
    #: from ``pruned_hash``, the hash of entry ``pruned_seq``. The database lets exactly those
    #: entries be deleted.
    pruned_seq: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    pruned_hash: Mapped[str] = mapped_column(String(64), server_default="0" * 64)


class AuditCount(Base):
    """How many entries of one minute or hour share a key (``core.domain.auditcounts``): what
    totals, stats and deep offsets read instead of the entries. Written by the batch that
    commits the entries, and by erasure and pruning, which take theirs back."""

    __tablename__ = "audit_counts"
    __table_args__ = (Index("ix_audit_counts_bucket", "workspace_id", "grain", "kind", "bucket"),)

    workspace_id: Mapped[str] = mapped_column(ForeignKey("workspaces.id"), primary_key=True)
    #: the bucket's length in seconds: 60 or 3600
    grain: Mapped[int] = mapped_column(Integer, primary_key=True)
    #: which of agent, tool and session the row keys: "*", "a", "t", "b" (agent and tool), "s"
    kind: Mapped[str] = mapped_column(String(1), primary_key=True)
    #: "" where the kind does not key it
    agent_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    tool_name: Mapped[str] = mapped_column(String(255), primary_key=True)
    session_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    #: the bucket's start, in seconds since the epoch (UTC)
    bucket: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    result: Mapped[str] = mapped_column(String(16), primary_key=True)
    action: Mapped[str] = mapped_column(String(32), primary_key=True)
    count: Mapped[int] = mapped_column(BigInteger)


class AuditTally(Base):
    """What one batch of decisions adds to one workspace's counts, written in the batch's
    transaction: ``counts`` is JSON, ``[[agent_id, tool_name, session_id, result, action,
    minute, n], ...]`` (``core.domain.auditcounts.Signature`` and how many). Folded into
    ``audit_counts`` and removed, in one transaction, off the hot path. No index but its key:
    it holds about a second of batches, read whole (migration 0008)."""

    __tablename__ = "audit_tallies"

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    workspace_id: Mapped[str] = mapped_column(ForeignKey("workspaces.id"))
    counts: Mapped[str] = mapped_column(Text)


class Approval(Base):
    """A call waiting for, or decided by, a human (decisions §6). ``status`` is as stored: a
    pending or approved one past ``expires_at`` reads as expired (``core.domain.approvals``).
    ``parameters`` are redacted as in the audit log; the digest is of the call as received."""

    __tablename__ = "approvals"
    __table_args__ = (
        Index(
            "ix_approvals_call",
            "workspace_id",
            "agent_id",
            "tool_name",
            "parameters_digest",
            "status",
        ),
        Index("ix_approvals_workspace_created", "workspace_id", "created_at", "id"),
        Index(
            "ux_approvals_pending_call",
            "workspace_id",
            "agent_id",
            "tool_name",
            "parameters_digest",
            unique=True,
            sqlite_where=text("status = 'pending'"),
            postgresql_where=text("status = 'pending'"),
        ),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    workspace_id: Mapped[str] = mapped_column(ForeignKey("workspaces.id"))
    agent_id: Mapped[str] = mapped_column(ForeignKey("agents.id", ondelete="CASCADE"), index=True)
    tool_name: Mapped[str] = mapped_column(String(255))
    parameters: Mapped[Any] = mapped_column(JSONType)
    parameters_digest: Mapped[str] = mapped_column(String(64))
    policy_id: Mapped[str] = mapped_column(String(36))
    rule_index: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    decided_at: Mapped[datetime | None]
    decided_by_key_id: Mapped[str | None] = mapped_column(String(36))
    decided_by_name: Mapped[str | None] = mapped_column(String(255))
    comment: Mapped[str | None] = mapped_column(Text)
    used_at: Mapped[datetime | None]
    requested_by_key_id: Mapped[str | None] = mapped_column(String(36))


class ApprovalRequester(Base):
    """A key that made a call matching the approval: none of them may decide it."""

    __tablename__ = "approval_requesters"

    approval_id: Mapped[str] = mapped_column(
        ForeignKey("approvals.id", ondelete="CASCADE"), primary_key=True
    )
    key_id: Mapped[str] = mapped_column(String(36), primary_key=True)


class Webhook(Base):
    __tablename__ = "webhooks"
    __table_args__ = (Index("ix_webhooks_workspace_created", "workspace_id", "created_at", "id"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    workspace_id: Mapped[str] = mapped_column(ForeignKey("workspaces.id"))
    url: Mapped[str] = mapped_column(Text)
    events: Mapped[str] = mapped_column(String(255))  # comma-separated, sorted
    description: Mapped[str | None] = mapped_column(Text)
    secret: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime]


class WebhookEvent(Base):
    """The outbox: an event stored in the transaction of what caused it, with one delivery row
    per webhook that subscribed to it."""

    __tablename__ = "webhook_events"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    workspace_id: Mapped[str] = mapped_column(ForeignKey("workspaces.id"))
    type: Mapped[str] = mapped_column(String(64))
    payload: Mapped[Any] = mapped_column(JSONType)
    created_at: Mapped[datetime]


class WebhookDelivery(Base):
    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        Index("ix_webhook_deliveries_webhook_created", "webhook_id", "created_at", "id"),
        Index("ix_webhook_deliveries_due", "status", "next_attempt_at"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    webhook_id: Mapped[str] = mapped_column(ForeignKey("webhooks.id", ondelete="CASCADE"))
    event_id: Mapped[str] = mapped_column(ForeignKey("webhook_events.id", ondelete="CASCADE"))
    event_type: Mapped[str] = mapped_column(String(64))
    attempt: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16))
    response_status: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime]
    next_attempt_at: Mapped[datetime | None]
    delivered_at: Mapped[datetime | None]


class Counter(Base):
    """A fixed-window counter: per API key per minute, or per rate_limit or budget rule (and
    session) per window. ``count`` is calls, or a budget's units; ``window_end`` (epoch
    seconds) says when a per-session counter may go."""

    __tablename__ = "rate_counters"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    window_start: Mapped[int] = mapped_column(BigInteger)
    count: Mapped[int] = mapped_column(BigInteger)
    window_end: Mapped[int | None] = mapped_column(BigInteger)


class SyncStatus(Base):
    """Per workspace: the revision the controller last tried to apply, with its result, and the
    last one it applied (which stays in force when a later attempt fails)."""

    __tablename__ = "sync_status"

    workspace_id: Mapped[str] = mapped_column(ForeignKey("workspaces.id"), primary_key=True)
    source: Mapped[str] = mapped_column(Text)
    attempted_revision: Mapped[str] = mapped_column(String(200))
    attempted_at: Mapped[datetime]
    result: Mapped[str] = mapped_column(String(16))
    error: Mapped[str | None] = mapped_column(Text)
    changes: Mapped[Any] = mapped_column(JSONType, nullable=True)  # counts per action
    # ids of the objects the last successful apply left managed
    inventory: Mapped[Any] = mapped_column(JSONType, nullable=True)
    applied_revision: Mapped[str | None] = mapped_column(String(200))
    applied_at: Mapped[datetime | None]
