"""``POST /v1/authorize``: may this agent call this tool with these parameters? 200 for allowed
and denied alike; the audit entry is committed before the answer leaves."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, g

from api import metrics
from api.auth import counts_in_its_transaction, key_slot
from api.context import now, principal, reader, services
from api.params import read_body
from core.decisions import authorize as decide
from core.errors import StorageError

bp = Blueprint("authorize", __name__)


@bp.post("/v1/authorize")
@counts_in_its_transaction
def authorize() -> dict[str, Any]:
    body = read_body("authorize.json#/$defs/request")
    svc = services()
    try:
        outcome = decide(
            svc.db,
            svc.policies,
            principal(),
            body,
            now(),
            g.received,
            reads=reader(),
            on_transaction=key_slot().take,
        )
    except StorageError:
        metrics.AUDIT_FAILURES.inc()
        raise
    metrics.DECISIONS.labels(outcome.decision.outcome).inc()
    metrics.LATENCY.observe(outcome.latency_ms / 1000)
    if outcome.decision.retry_after_seconds is not None:
        metrics.RATE_LIMITED.labels("rule").inc()
    return outcome.as_response()
