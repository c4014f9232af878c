"""``GET /metrics``: Prometheus text for the people who run the service.

- ``agentauth_decisions_total{outcome}``: committed decisions, by outcome;
- ``agentauth_decision_latency_seconds``: from receipt to decision, a histogram;
- ``agentauth_audit_write_failures_total``: decisions that could not be recorded (each answered
  500, never an allow);
- ``agentauth_rate_limit_denials_total{limit}``: calls refused by a ``rate_limit`` rule
  (``limit="rule"``) or by the per-key request budget (``limit="key"``);
- ``agentauth_would_be_decisions_total{policy_id,result}``: would-be decisions (decisions
  §10), by the policy that made them (empty for the default deny, an agent's status and an
  error) and their result (``allowed``, ``denied``, ``escalated``, ``error``);
- ``agentauth_webhook_deliveries_total{result}``: webhook delivery tries, counted by the
  delivery worker (``api.outbox``): ``delivered``, ``retry`` (failed, tried again later) or
  ``failed`` (failed for good, 24 hours after the event);
- ``agentauth_checkpoint_lag_entries{workspace}``: with ``AGENTAUTH_CHECKPOINT_FILE`` set,
  how many entries of each workspace's log the newest checkpoint kept in that file is behind
  (``api.checkpoint_file``, updated every second);
- ``agentauth_requests_in_flight``: requests being served right now (the scrape included), the
  number a graceful shutdown waits for;
- ``agentauth_sync_last_success_timestamp_seconds{workspace}`` and
  ``agentauth_sync_last_applied_info{workspace,revision}``: what the controller last applied,
  read from the database at each scrape;
- ``agentauth_approvals_pending{workspace}``: approvals waiting for a human now (unexpired),
  read from the database at each scrape.

Under ``agentauth serve`` the counts are exact across worker processes (prometheus_client's
multiprocess mode: each worker writes its own file in a folder ``serve`` makes, and a scrape
adds them up). No key is needed: the numbers are global, with workspace ids but no names; keep
the endpoint on an internal network.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime

from flask import Blueprint, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from api.auth import public
from api.context import now, services
from core.domain.errors import StorageError
from core.store.approvals import pending_by_workspace
from core.store.database import Database
from core.store.sync_status import applied_revisions

#: set by ``agentauth serve`` before its workers start (prometheus_client reads it at import)
MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"

DECISIONS = Counter("agentauth_decisions", "Committed authorization decisions", ["outcome"])
LATENCY = Histogram(
    "agentauth_decision_latency_seconds",
    "Time from receipt of an authorize request to its committed decision",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
BATCH_SIZE = Histogram(
    "agentauth_decision_batch_size",
    "Writes of the decision path committed together, one observation per commit: authorize "
    "decisions (and the count of a refused call against its key, an approval decided)",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
AUDIT_FAILURES = Counter(
    "agentauth_audit_write_failures", "Decisions whose audit entry could not be written"
)
IN_FLIGHT = Gauge(
    "agentauth_requests_in_flight",
    "Requests being served, the scrape included",
    multiprocess_mode="livesum",
)
RATE_LIMITED = Counter("agentauth_rate_limit_denials", "Calls refused by a rate limit", ["limit"])
CHECKPOINT_LAG = Gauge(
    "agentauth_checkpoint_lag_entries",
    "Entries of a workspace's audit log past the newest checkpoint kept in "
    "AGENTAUTH_CHECKPOINT_FILE",
    ["workspace"],
    multiprocess_mode="livemax",
)
WOULD_BE = Counter(
    "agentauth_would_be_decisions",
    "Would-be decisions of agents with warn or shadow policies, by the policy that made them "
    "and their result",
    ["policy_id", "result"],
)
WEBHOOK_DELIVERIES = Counter(
    "agentauth_webhook_deliveries", "Webhook delivery tries, by what came of them", ["result"]
)
for _outcome in ("allowed", "denied", "escalated"):  # present from the first scrape, at 0
    DECISIONS.labels(_outcome)
for _limit in ("rule", "key"):
    RATE_LIMITED.labels(_limit)
for _result in ("delivered", "retry", "failed"):
    WEBHOOK_DELIVERIES.labels(_result)

bp = Blueprint("metrics", __name__)


class _DatabaseCollector(Collector):
    """What the controller last applied, and the approvals pending, per workspace, read at
    scrape time."""

    def __init__(self, db: Database, now: datetime) -> None:
        self.db, self.now = db, now

    def collect(self) -> Iterator[Metric]:
        when = GaugeMetricFamily(
            "agentauth_sync_last_success_timestamp_seconds",
            "Unix time of the last successful apply of a policy repository",
            labels=["workspace"],
        )
        info = GaugeMetricFamily(
            "agentauth_sync_last_applied_info",
            "The revision of the policy repository in force (always 1)",
            labels=["workspace", "revision"],
        )
        pending = GaugeMetricFamily(
            "agentauth_approvals_pending",
            "Approvals waiting for a human decision, unexpired",
            labels=["workspace"],
        )
        try:
            with self.db.transaction() as session:
                rows = applied_revisions(session)
                waiting = pending_by_workspace(session, self.now)
        except StorageError:
            rows, waiting = [], []  # the scrape still answers; /readyz says the database is away
        for workspace, revision, at in rows:
            moment = at if at.tzinfo else at.replace(tzinfo=UTC)
            when.add_metric([workspace], moment.timestamp())
            info.add_metric([workspace, revision], 1.0)
        for workspace, count in waiting:
            pending.add_metric([workspace], float(count))
        yield when
        yield info
        yield pending


@bp.get("/metrics")
@public
def metrics() -> Response:
    registry = CollectorRegistry()
    if os.environ.get(MULTIPROCESS_ENV):
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        counts = generate_latest(registry)
    else:
        counts = generate_latest(REGISTRY)
    sync = CollectorRegistry()
    sync.register(_DatabaseCollector(services().db, now()))
    return Response(counts + generate_latest(sync), content_type=CONTENT_TYPE_LATEST)
