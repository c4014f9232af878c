"""Approvals in the domain (decisions §6): what an approval is bound to (the parameters digest),
the statuses it reads as, what the engine asks of whoever keeps approvals
(:class:`CallApprovals`), and the in-memory approvals of the offline runner and the case tests
(:class:`MemoryApprovals`). The database's are ``core.hotpath.approvals``; the engine
(``core.domain.engine``) says when a call needs one and settles it.
"""

from __future__ import annotations

import hashlib
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Protocol

import rfc8785

from core.domain.redaction import scrub


class ApprovalStatus(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    EXPIRED = "expired"
    USED = "used"


#: stored statuses that expire: past ``expiresAt`` they read as ``expired``, everywhere
EXPIRING = frozenset({ApprovalStatus.PENDING, ApprovalStatus.APPROVED})


def effective_status(stored: str, expires_at: datetime, now: datetime) -> ApprovalStatus:
    """What an approval reads as at ``now``: a pending or approved one past its expiry is
    expired; a denied one stays denied (it only stops matching calls)."""
    status = ApprovalStatus(stored)
    return ApprovalStatus.EXPIRED if status in EXPIRING and expires_at <= now else status


def parameters_digest(parameters: Any) -> str | None:
    """SHA-256 hex of ``parameters`` in RFC 8785 canonical JSON, so ``1500.0`` and ``1500`` are
    the same call. None when they have no exact canonical form (an integer beyond ±2^53, which
    JSON's numbers cannot tell from its neighbours): such a call cannot be bound to an approval.
    """
    try:
        canonical = rfc8785.dumps(parameters)
    except rfc8785.CanonicalizationError:
        return None
    return hashlib.sha256(canonical).hexdigest()


def call_digest(tool_name: str, parameters: Any) -> str | None:
    """The parameters digest an approval of this call is bound to; None when the call cannot be
    bound to one: its parameters have no exact canonical form, or its tool name holds an API key
    of this service (stored approvals show tool names with keys masked, and two names that
    differ only in the key would read the same)."""
    if scrub(tool_name) != tool_name:
        return None
    return parameters_digest(parameters)


@dataclass(frozen=True, slots=True)
class FoundApproval:
    """An approval as a call sees it: its id, what it reads as now, when it expires."""

    id: str
    status: ApprovalStatus
    expires_at: datetime


#: which of a call's unexpired approvals governs it: approved before denied before pending
_PRECEDENCE = (ApprovalStatus.APPROVED, ApprovalStatus.DENIED, ApprovalStatus.PENDING)


def governing(found: Iterable[FoundApproval]) -> FoundApproval | None:
    """Of a call's unexpired approvals, the one that decides it (``CallApprovals.current``)."""
    candidates = list(found)
    for status in _PRECEDENCE:
        for approval in candidates:
            if approval.status is status:
                return approval
    return None


class CallApprovals(Protocol):
    """The approvals that match one call (its workspace, agent, tool name and parameters
    digest), as the engine's :func:`core.domain.engine.settle` uses them. Every method runs in
    the transaction that records the call's decision."""

    def current(self, now: datetime) -> FoundApproval | None:
        """The approval that governs the call at ``now``: an approved, unused, unexpired one
        first; else a denied, unexpired one; else a pending, unexpired one; else None."""
        ...

    def use(self, approval_id: str, now: datetime) -> bool:
        """Mark an approved approval used; False when it no longer is approved and unused
        (another identical call took it first)."""
        ...

    def restore(self, approval_id: str) -> None:
        """Undo :meth:`use` (the grant was refused by a rate limit: nothing is consumed)."""
        ...

    def request(self, ttl_seconds: int, policy_id: str, rule_index: int, now: datetime) -> Any:
        """The pending approval the call waits for, as a :class:`FoundApproval`: the unexpired
        one there is (and this caller is recorded as asking too), else a new one that expires
        ``ttl_seconds`` after ``now``."""
        ...


class MemoryApprovals:
    """Approvals kept in memory, for one process: the controller's offline ``agentauth test``
    runner and the case tests, which also decide them (:meth:`decide`). One instance holds the
    approvals of every call; :meth:`for_call` gives the view :func:`settle` takes."""

    def __init__(self) -> None:
        self._rows: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def for_call(self, tool_name: str, parameters: Any) -> _MemoryCall | None:
        digest = call_digest(tool_name, parameters)
        return None if digest is None else _MemoryCall(self, (tool_name, digest))

    def decide(self, approval_id: str, approved: bool, now: datetime) -> bool:
        """Approve or deny a pending, unexpired approval; False when it is not pending."""
        with self._lock:
            row = self._rows.get(approval_id)
            if row is None or effective_status(row["status"], row["expires"], now) != "pending":
                return False
            row["status"] = ApprovalStatus.APPROVED if approved else ApprovalStatus.DENIED
            return True

    def status(self, approval_id: str, now: datetime) -> ApprovalStatus:
        with self._lock:
            row = self._rows[approval_id]
            return effective_status(row["status"], row["expires"], now)


class _MemoryCall:
    def __init__(self, store: MemoryApprovals, key: tuple[str, str]) -> None:
        self._store, self._key = store, key

    def current(self, now: datetime) -> FoundApproval | None:
        with self._store._lock:
            found = [
                FoundApproval(id, ApprovalStatus(row["status"]), row["expires"])
                for id, row in self._store._rows.items()
                if row["key"] == self._key and row["expires"] > now  # unexpired: status as is
            ]
        return governing(found)

    def use(self, approval_id: str, now: datetime) -> bool:
        with self._store._lock:
            row = self._store._rows[approval_id]
            if row["status"] != ApprovalStatus.APPROVED or row["expires"] <= now:
                return False
            row["status"] = ApprovalStatus.USED
            return True

    def restore(self, approval_id: str) -> None:
        with self._store._lock:
            self._store._rows[approval_id]["status"] = ApprovalStatus.APPROVED

    def request(
        self, ttl_seconds: int, policy_id: str, rule_index: int, now: datetime
    ) -> FoundApproval:
        current = self.current(now)
        if current is not None and current.status is ApprovalStatus.PENDING:
            return current
        approval_id = str(uuid.uuid4())
        expires = now + timedelta(seconds=ttl_seconds)
        with self._store._lock:
            row = {"key": self._key, "status": ApprovalStatus.PENDING, "expires": expires}
            self._store._rows[approval_id] = row
        return FoundApproval(approval_id, ApprovalStatus.PENDING, expires)
