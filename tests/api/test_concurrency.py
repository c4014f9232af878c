"""Rate-limit rules are exact under concurrency: several client processes hammer one rule
through a server with several worker processes; exactly maxCalls calls are allowed per window,
and the audit log agrees with what the clients were told."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime

import httpx
import pytest

from api import create_app
from tests.conftest import Tenant, bearer
from tests.server import running_server

MAX_CALLS = 25
WINDOW = 3600
CLIENTS = 4
CALLS_PER_CLIENT = 15


def _hammer(base: str, key: str, agent_id: str) -> list[tuple[bool, str]]:
    """One client process: its decisions as (allowed, auditId)."""
    body = {"agent_id": agent_id, "tool_name": "payments.refund", "parameters": {"amount": 5}}
    out = []
    with httpx.Client(base_url=base, headers=bearer(key), timeout=60) as http:
        for _ in range(CALLS_PER_CLIENT):
            response = http.post("/v1/authorize", json=body)
            assert response.status_code == 200, response.text
            out.append((response.json()["allowed"], response.json()["auditId"]))
    return out


@pytest.mark.slow
def test_exactly_max_calls_allowed_across_processes(database_url, settings, clock):
    app = create_app(settings)
    tenant = Tenant(app, f"concurrency-{clock.moment.timestamp()}", clock)
    key = tenant.key("admin")
    client = app.test_client()
    agent = client.post("/v1/agents", json={"name": "refunds"}, headers=bearer(key)).json
    rules = [
        {"type": "rate_limit", "rateLimit": {"maxCalls": MAX_CALLS, "windowSeconds": WINDOW}},
        {"type": "tool_allowlist", "tools": ["payments.*"]},
    ]
    policy = {"agent_id": agent["id"], "name": "refunds", "rules": rules}
    assert client.post("/v1/policies", json=policy, headers=bearer(key)).status_code == 201

    env = {"AGENTAUTH_RATE_LIMIT_PER_MINUTE": "100000"}
    with (
        running_server(database_url, workers=3, threads=4, env=env) as base,
        ProcessPoolExecutor(max_workers=CLIENTS) as pool,
    ):
        futures = [pool.submit(_hammer, base, key, agent["id"]) for _ in range(CLIENTS)]
        told = [decision for future in futures for decision in future.result()]

    query = {"agent_id": agent["id"], "limit": 1000}
    entries = client.get("/v1/audit-logs", query_string=query, headers=bearer(key)).json["data"]
    app.extensions["agentauth"].close()
    assert len(told) == CLIENTS * CALLS_PER_CLIENT == len(entries)
    recorded = {entry["id"]: entry["result"] == "allowed" for entry in entries}
    assert {audit_id: allowed for allowed, audit_id in told} == recorded
    # windows are fixed and epoch-aligned: judge each window the calls fell into on its own
    per_window: Counter[int] = Counter()
    allowed_per_window: Counter[int] = Counter()
    for entry in entries:
        moment = datetime.fromisoformat(entry["timestamp"].replace("Z", "+00:00"))
        window = int(moment.timestamp()) // WINDOW
        per_window[window] += 1
        allowed_per_window[window] += entry["result"] == "allowed"
    for window, calls in per_window.items():
        assert allowed_per_window[window] == min(MAX_CALLS, calls)
