"""Authorization decisions: the agent's compiled policies, the pure engine, rate-limit
consumption and the audit entry, written in one transaction that commits before anyone is told.

Each call is decided once, in the recorder's read phase before its batch's write transaction,
so that only writes happen under the write lock: a grant pending on rate limits has just its
counters taken there (bench/RESULTS.md, "Why the code is shaped this way"). Called by
``api/authorize.py``, on the recorder's thread. Fail
closed: if anything here raises, including the audit write or the commit, the caller answers 500
and never an allow.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Connection, bindparam, select

from core.domain.approvals import call_digest
from core.domain.auditchain import canonical_json
from core.domain.clock import isoformat
from core.domain.compiler import compile_policy
from core.domain.engine import (
    CompiledPolicy,
    Decision,
    Evaluated,
    NeedsApproval,
    deny_agent_status,
    deny_unknown_agent,
    evaluate,
    order_policies,
    settle,
)
from core.domain.limits import Charge, Refusal
from core.domain.modes import FAILED, PolicySet, Trial, WouldBe, peek
from core.domain.redaction import redact, scrub
from core.hotpath.approvals import BatchApprovals
from core.hotpath.reads import AgentRow, Reads
from core.hotpath.recorder import Batch, Statements
from core.store import audit
from core.store.agents import AgentStatus
from core.store.database import Database
from core.store.keys import Principal
from core.store.limits import CounterStore
from core.store.models import Policy

log = logging.getLogger("agentauth.decisions")
T = TypeVar("T")


@dataclass(frozen=True)
class Outcome:
    """A committed decision: what was decided, the audit entry that records it, and how long
    the decision took from receipt of the request."""

    decision: Decision
    audit_id: str
    latency_ms: float
    session_id: str | None = None
    #: the would-be decision (decisions §10), None when the agent has no warn or shadow policy
    would_be: WouldBe | None = None

    def as_response(self) -> dict[str, Any]:
        d = self.decision
        body: dict[str, Any] = {
            "allowed": d.allowed,
            "outcome": d.outcome,
            "reason": scrub(d.reason),  # as audited: a key in the tool name is never echoed
            "policyId": d.policy_id,
            "ruleIndex": d.rule_index,
            "auditId": self.audit_id,
            "latencyMs": self.latency_ms,
        }
        if d.retry_after_seconds is not None:
            body["retryAfterSeconds"] = d.retry_after_seconds
        body["approvalId"] = d.approval_id
        if self.session_id is not None:  # as audited (scrubbed of keys like every text)
            body["sessionId"] = self.session_id
        if d.approval_expires_at is not None:
            body["approvalExpiresAt"] = isoformat(d.approval_expires_at)
        warning = None if self.would_be is None else self.would_be.warning(d)
        if warning is not None:  # its reason as audited (scrubbed of keys like every text)
            warning["reason"] = scrub(warning["reason"])
        body["warnings"] = [] if warning is None else [warning]
        return body


class PolicyCache:
    """Compiled policies per agent, keyed by the agent's ``policy_version``.

    Every policy change bumps that version in its own transaction, and each decision reads the
    agent row in its transaction, so a change committed by any process is in force for the very
    next decision: the cache can be cold, never stale. (``created_at`` is part of the key too:
    an agent deleted and created again under a pinned id starts again at version 0.)
    """

    def __init__(self, max_agents: int = 10_000) -> None:
        self._entries: dict[str, tuple[tuple[datetime, int], PolicySet]] = {}
        self._max = max_agents
        self._lock = threading.Lock()

    def policies(self, db: Database, workspace_id: str, agent: AgentRow) -> PolicySet:
        """The agent's policies as of ``agent.policy_version`` or later: on a miss they are
        read after the agent row was, so what is stored under a version is never older than
        it (a newer set stored under an older version is replaced at the next call)."""
        version = (agent.created_at, agent.policy_version)
        found = self._entries.get(agent.id)
        if found is not None and found[0] == version:
            return found[1]
        with db.connect() as connection:
            compiled = PolicySet.of(load_policies(connection, workspace_id, agent.id))
        with self._lock:
            if len(self._entries) >= self._max:
                self._entries.clear()  # crude but bounded; recompiling is cheap
            self._entries[agent.id] = (version, compiled)
        return compiled


_POLICIES = Policy.__table__
_ENABLED_POLICIES = select(
    _POLICIES.c.id,
    _POLICIES.c.name,
    _POLICIES.c.priority,
    _POLICIES.c.created_at,
    _POLICIES.c.rules,
    _POLICIES.c.mode,
).where(
    _POLICIES.c.workspace_id == bindparam("workspace_id"),
    _POLICIES.c.agent_id == bindparam("agent_id"),
    _POLICIES.c.enabled.is_(True),
)


def load_policies(connection: Connection, workspace_id: str, agent_id: str) -> list[CompiledPolicy]:
    """The workspace's agent's enabled policies, compiled, in evaluation order."""
    rows = connection.execute(
        _ENABLED_POLICIES, {"workspace_id": workspace_id, "agent_id": agent_id}
    )
    return order_policies(
        compile_policy(
            id=row.id,
            name=row.name,
            priority=row.priority,
            enabled=True,
            created_at=row.created_at,
            rules=row.rules,
            mode=row.mode,
        )
        for row in rows
    )


class BatchCounters:
    """The engine's ``consume`` against the shared counters: every charge or none, atomically
    (a savepoint undoes the ones taken before one that does not fit)."""

    def __init__(self, batch: Batch) -> None:
        self.batch = batch

    def __call__(self, charges: Sequence[Charge], now: datetime) -> Refusal | None:
        if not charges:
            return None
        mark = self.batch.savepoint()
        for charge in charges:
            limit = charge.limit
            start = limit.window_start(now)
            taken = charge.fits_alone and (
                self.batch.consume(
                    charge.key, start, limit.maximum, charge.amount, start + limit.window_seconds
                )
                is not None
            )
            if not taken:
                self.batch.rollback_to(mark)
                # the window that refused (this call's, or a later one) and what it holds
                found = self.batch.stored(charge.key)
                if found is None or found.window_start < start:  # the amount alone is too big
                    return Refusal(charge, 0, start)
                return Refusal(charge, found.held, found.window_start)
        self.batch.release(mark)
        return None


def authorize(
    db: Database,
    statements: Statements,
    cache: PolicyCache,
    caller: Principal,
    body: dict[str, Any],
    now: datetime,
    received: float,
    *,
    reads: Reads,
    on_transaction: Callable[[CounterStore], None] | None = None,
) -> Callable[[Batch], Outcome]:
    """Decide, and return the job that records the decision: a read phase of the recorder's
    (:meth:`core.hotpath.recorder.Recorder.run` with ``read``), run on its thread before the
    batch's write transaction. ``received`` is the ``time.perf_counter()`` reading taken when
    the request arrived; ``body`` is a valid authorize request. ``on_transaction`` runs first
    inside the decision's transaction (the API counts the request against its key there).

    The agent and its policies are read here, without the write lock (a policy change
    committed before this batch started is seen: the agent's version says so). The writes
    (counters, audit entry) then happen in the batch, which answers only once they are
    durable. When the agent has a warn or shadow policy, the would-be decision is made beside
    the real one (decisions §10): evaluated here, settled in the batch when it needs counters;
    whatever fails in it makes it ``error`` and leaves the real decision as it is.
    """
    agent_id = body["agent_id"].lower()
    tool_name: str = body["tool_name"]
    parameters: dict[str, Any] = body.get("parameters") or {}
    session_id: str | None = body.get("session_id")
    agent = reads.agent(agent_id, caller.workspace_id)
    trial: Trial | WouldBe | None = None
    if agent is None:
        decided: Evaluated = deny_unknown_agent(agent_id)
    elif agent.status != AgentStatus.ACTIVE:
        decided = deny_agent_status(agent.status)
        trial = _status_trial(db, cache, caller.workspace_id, agent, decided)
    else:  # decided here, off the write lock; a grant pending on rate limits is settled inside
        policies = cache.policies(db, caller.workspace_id, agent)
        decided = evaluate(policies.enforced, tool_name, parameters, now, session_id)
        if policies.every is not None:
            trial = _trial(policies, tool_name, parameters, now, session_id)

    def entry(
        decision: Decision, would_be: WouldBe | None, redacted: dict[str, Any] | None = None
    ) -> tuple[Outcome, dict[str, Any]]:
        latency_ms = round((time.perf_counter() - received) * 1000, 3)
        row = audit.entry(
            workspace_id=caller.workspace_id,
            agent_id=agent_id,
            agent_exists=agent is not None,
            key_id=caller.key_id,
            tool_name=tool_name,
            parameters=parameters,
            result=decision.outcome,
            policy_id=decision.policy_id,
            rule_index=decision.rule_index,
            reason=decision.reason,
            latency_ms=latency_ms,
            timestamp=now,
            approval_id=decision.approval_id,
            session_id=session_id,
            redacted=redacted,
            would_be=would_be,
        )
        outcome = Outcome(decision, row["id"], latency_ms, row["session_id"], would_be)
        return outcome, row

    if isinstance(decided, Decision) and not isinstance(trial, Trial):
        # the audit row too is made before the hand-off
        outcome, row = entry(decided, trial)
        values = statements.audit_row(row)

        def record(batch: Batch) -> Outcome:
            if on_transaction is not None:
                on_transaction(batch)
            batch.insert_audit(values)
            return outcome

        return record

    pending = decided
    trial_pending = trial if isinstance(trial, Trial) else None
    trial_ready = None if isinstance(trial, Trial) else trial
    digest = call_digest(tool_name, parameters) if isinstance(pending, NeedsApproval) else None
    # made here, off the write lock, like everything a batch job need not do inside it:
    # the parameters as audited, and their part of the entry's canonical JSON
    redacted = redact(parameters)
    parameters_json = canonical_json(redacted)

    def record_pending(batch: Batch) -> Outcome:
        if on_transaction is not None:
            on_transaction(batch)
        approvals = None
        if digest is not None:
            approvals = BatchApprovals(
                batch,
                statements.approvals,
                workspace_id=caller.workspace_id,
                agent_id=agent_id,
                tool_name=tool_name,
                digest=digest,
                redacted=redacted,
                key_id=caller.key_id,
            )
        settling = None if trial_pending is None else _Settling(batch, trial_pending, now)
        decision = settle(pending, BatchCounters(batch), approvals)
        would_be = trial_ready if settling is None else settling.finish(decision)
        outcome, row = entry(decision, would_be, redacted)
        batch.append_audit(row, parameters_json)
        return outcome

    return record_pending


def _trial(
    policies: PolicySet,
    tool_name: str,
    parameters: dict[str, Any],
    now: datetime,
    session_id: str | None,
) -> Trial | WouldBe:
    """The would-be decision, evaluated over every enabled policy: decided already when it
    needs no counter and no approval, else the trial to settle in the batch (:data:`FAILED`
    when that fails: the real decision is made all the same)."""
    try:
        assert policies.every is not None
        evaluated = evaluate(policies.every, tool_name, parameters, now, session_id)
        trial = Trial(evaluated, policies.warn_ids, policies.trial_ids)
        return trial.decided or trial
    except Exception:
        log.exception("the would-be decision failed (the real decision stands)")
        return FAILED


def _status_trial(
    db: Database, cache: PolicyCache, workspace_id: str, agent: AgentRow, denied: Decision
) -> WouldBe | None:
    """The would-be decision of a suspended or revoked agent's call: its status denies it
    whatever the policies, so the would-be decision is that deny when the agent has a warn or
    shadow policy (None when it has none)."""
    try:
        policies = cache.policies(db, workspace_id, agent)
    except Exception:
        log.exception("the would-be decision failed (the real decision stands)")
        return FAILED
    return None if policies.every is None else WouldBe.of(denied)


class _Settling:
    """A would-be decision pending on counters, settled in the batch beside the real one: the
    enforced policies' counters it needs are read first, as they stand before the real
    decision takes its own (when made, before the real decision is settled); then its own
    policies' charges are taken (:meth:`finish`). Each step in a savepoint: whatever fails in
    it is undone, and the would-be decision is ``error``."""

    def __init__(self, batch: Batch, trial: Trial, now: datetime) -> None:
        self._batch = batch
        self._trial = trial
        self._failed = False
        self._refused: Refusal | None = None
        charges = trial.enforced_charges
        if charges:
            self._refused = self._guarded(lambda: peek(charges, now, self._stored))

    def finish(self, real: Decision) -> WouldBe:
        """The would-be decision, given the real one (settled since)."""
        if self._failed:
            return FAILED
        counters = BatchCounters(self._batch)
        found = self._guarded(lambda: self._trial.settle(real, self._refused, counters))
        return FAILED if found is None else found

    def _stored(self, key: str) -> tuple[int, int] | None:
        found = self._batch.stored(key)
        return None if found is None else (found.window_start, found.held)

    def _guarded(self, step: Callable[[], T]) -> T | None:
        """``step``'s value, in a savepoint; None (and the savepoint undone) when it fails."""
        mark = self._batch.savepoint()
        try:
            value = step()
        except Exception:
            log.exception("the would-be decision failed (the real decision stands)")
            self._batch.rollback_to(mark)
            self._failed = True
            return None
        self._batch.release(mark)
        return value
