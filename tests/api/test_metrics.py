"""GET /metrics: Prometheus text whose counts follow what the service did, exact across the
worker processes of a real ``agentauth serve``."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.api.helpers import decide, make_agent
from tests.server import running_server


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def read(client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.mimetype == "text/plain"
    return samples(response.get_data(as_text=True))


ALLOWED = ("agentauth_decisions_total", (("outcome", "allowed"),))
DENIED = ("agentauth_decisions_total", (("outcome", "denied"),))
RULE_LIMITED = ("agentauth_rate_limit_denials_total", (("limit", "rule"),))
LATENCY_COUNT = ("agentauth_decision_latency_seconds_count", ())
BATCHES = ("agentauth_decision_batch_size_count", ())
BATCHED = ("agentauth_decision_batch_size_sum", ())


def test_decisions_latency_and_rule_limits_are_counted(client, admin_headers):
    rules = [
        {
            "type": "rate_limit",
            "tools": ["mail.*"],
            "rateLimit": {"maxCalls": 1, "windowSeconds": 60},
        },
        {"type": "tool_allowlist", "tools": ["mail.*"]},
    ]
    agent = make_agent(client, admin_headers, rules=rules)
    before = read(client)
    assert decide(client, admin_headers, agent, "mail.send")["allowed"] is True
    assert decide(client, admin_headers, agent, "mail.send")["allowed"] is False  # limit spent
    assert decide(client, admin_headers, agent, "shell.exec")["allowed"] is False
    after = read(client)
    assert after[ALLOWED] - before[ALLOWED] == 1
    assert after[DENIED] - before[DENIED] == 2
    assert after[RULE_LIMITED] - before[RULE_LIMITED] == 1
    assert after[LATENCY_COUNT] - before[LATENCY_COUNT] == 3
    # one after the other: each decision committed alone
    assert after[BATCHES] - before[BATCHES] == 3
    assert after[BATCHED] - before[BATCHED] == 3
    assert ("agentauth_audit_write_failures_total", ()) in after


def test_decisions_made_at_once_are_counted_once_in_the_batches_that_committed_them(
    client, admin_headers
):
    agent = make_agent(client, admin_headers, rules=[{"type": "tool_allowlist"}])
    before = read(client)
    with ThreadPoolExecutor(8) as pool:
        answers = list(
            pool.map(lambda _: decide(client, admin_headers, agent, "search"), range(40))
        )
    after = read(client)
    assert all(answer["allowed"] for answer in answers)
    assert after[BATCHED] - before[BATCHED] == 40
    assert 1 <= after[BATCHES] - before[BATCHES] <= 40


ESCALATED = ("agentauth_decisions_total", (("outcome", "escalated"),))


def test_escalations_are_counted_and_pending_approvals_shown_per_workspace(
    client, admin_headers, workspace, clock
):
    rules = [{"type": "require_approval", "tools": ["payments.*"]}, {"type": "tool_allowlist"}]
    agent = make_agent(client, admin_headers, rules=rules)
    pending = ("agentauth_approvals_pending", (("workspace", workspace.id),))
    before = read(client)
    assert pending not in before  # a workspace with nothing pending is not listed
    for amount in (1, 1, 2):  # the second call reuses the first one's approval
        assert (
            decide(client, admin_headers, agent, "payments.refund", amount=amount)["outcome"]
            == "escalated"
        )
    after = read(client)
    assert after[ESCALATED] - before[ESCALATED] == 3
    assert after[pending] == 2
    clock.advance(3600)  # both expire: pending no more
    assert pending not in read(client)


def test_metrics_need_no_key_and_name_no_secret(client, workspace):
    key = workspace.key("admin")
    response = client.get("/metrics")
    assert response.status_code == 200
    assert key not in response.get_data(as_text=True)


def test_counts_are_exact_across_worker_processes(database_url, workspace, client, admin_headers):
    """Concurrent calls spread over both workers; every scrape, whichever worker answers it,
    adds up all of them (a worker's own counts alone would fall short)."""
    agent = make_agent(
        client, admin_headers, rules=[{"type": "tool_allowlist", "tools": ["calendar.*"]}]
    )
    key = workspace.key("read-only")
    tools = ["shell.exec" if i % 4 == 0 else "calendar.create" for i in range(40)]
    with (
        running_server(database_url, workers=2, threads=2) as base,
        httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}) as http,
    ):

        def call(tool: str) -> int:
            body = {"agent_id": agent, "tool_name": tool, "parameters": {}}
            return http.post("/v1/authorize", json=body).status_code

        with ThreadPoolExecutor(8) as pool:
            assert set(pool.map(call, tools)) == {200}
        scrapes = [samples(http.get("/metrics").text) for _ in range(6)]
    for found in scrapes:
        assert found[ALLOWED] == 30
        assert found[DENIED] == 10
        assert found[LATENCY_COUNT] == 40
