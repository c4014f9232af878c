"""Budgets and sessions through the API (decisions §8): sums exact across processes, fractional
amounts summed exactly, per-session counters, the windows' reset under a fixed clock, the
session on audit entries and in their filters, an agent's usage, and per-session counters
removed once their window is over. The branches of the semantics are data in
``tests/cases/budgets.yaml`` and ``sessions.yaml``; these are what the database adds."""

from __future__ import annotations

import csv
import io
import json
import math
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime
from decimal import Decimal
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from api import create_app
from api.outbox import sweep
from core.store.models import Counter as CounterRow
from tests.conftest import Tenant, bearer
from tests.server import running_server

WINDOW = 3600


def budget(max_: float, *, per: str = "agent", window: int = WINDOW) -> dict[str, Any]:
    return {
        "type": "budget",
        "tools": ["payments.*"],
        "per": per,
        "budget": {"parameter": "amount", "max": max_, "windowSeconds": window},
    }


def new_agent(client: Any, headers: dict[str, str], *rules: dict[str, Any]) -> str:
    agent = client.post("/v1/agents", json={"name": "refunds"}, headers=headers).json["id"]
    body = {"agent_id": agent, "name": "spend", "rules": [*rules, {"type": "tool_allowlist"}]}
    answer = client.post("/v1/policies", json=body, headers=headers)
    assert answer.status_code == 201, answer.json
    return str(agent)


def refund(client: Any, headers: dict[str, str], agent: str, amount: Any, **extra: Any) -> Any:
    body = {"agent_id": agent, "tool_name": "payments.refund", "parameters": {"amount": amount}}
    answer = client.post("/v1/authorize", json={**body, **extra}, headers=headers)
    assert answer.status_code == 200, answer.json
    return answer.json


def _spend(base: str, key: str, agent: str, amount: float, calls: int) -> list[tuple[bool, str]]:
    """One client process: its decisions as (allowed, auditId)."""
    body = {"agent_id": agent, "tool_name": "payments.refund", "parameters": {"amount": amount}}
    out = []
    with httpx.Client(base_url=base, headers=bearer(key), timeout=60) as http:
        for _ in range(calls):
            answer = http.post("/v1/authorize", json=body)
            assert answer.status_code == 200, answer.text
            out.append((answer.json()["allowed"], answer.json()["auditId"]))
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("amount", "max_"), [(300, 10_000), (0.1, 2.5)], ids=["300", "0.1"])
def test_processes_spending_one_budget_take_exactly_what_fits(
    database_url, settings, clock, amount, max_
):
    """4 client processes, 15 calls each, against a server of 3 worker processes: each window
    allows exactly floor(max / amount) of the calls it holds (as exact decimals: 2.5 / 0.1 is
    25, where floating point says 24.999...)."""
    app = create_app(settings)
    tenant = Tenant(app, f"budget-{clock.moment.timestamp()}-{amount}", clock)
    key = tenant.key("admin")
    client = app.test_client()
    agent = new_agent(client, bearer(key), budget(max_))
    fits = math.floor(Decimal(str(max_)) / Decimal(str(amount)))
    assert fits == 25 if amount == 0.1 else 33
    env = {"AGENTAUTH_RATE_LIMIT_PER_MINUTE": "100000"}
    with (
        running_server(database_url, workers=3, threads=4, env=env) as base,
        ProcessPoolExecutor(max_workers=4) as pool,
    ):
        futures = [pool.submit(_spend, base, key, agent, amount, 15) for _ in range(4)]
        told = [decision for future in futures for decision in future.result()]
    query = {"agent_id": agent, "limit": 1000}
    entries = client.get("/v1/audit-logs", query_string=query, headers=bearer(key)).json["data"]
    app.extensions["agentauth"].close()
    assert len(told) == 60 == len(entries)
    recorded = {entry["id"]: entry["result"] == "allowed" for entry in entries}
    assert {audit_id: allowed for allowed, audit_id in told} == recorded
    calls: Counter[int] = Counter()
    allowed: Counter[int] = Counter()
    for entry in entries:  # windows are fixed and epoch-aligned: each is judged on its own
        moment = datetime.fromisoformat(entry["timestamp"].replace("Z", "+00:00"))
        calls[int(moment.timestamp()) // WINDOW] += 1
        allowed[int(moment.timestamp()) // WINDOW] += entry["result"] == "allowed"
    for window, made in calls.items():
        assert allowed[window] == min(fits, made)
    for entry in entries:
        if entry["result"] == "denied":
            assert "(budget): budget of" in entry["reason"]


def test_a_fractional_budget_admits_exactly_three_tenths(client, admin_headers):
    agent = new_agent(client, admin_headers, budget(0.3))
    results = [refund(client, admin_headers, agent, 0.1)["allowed"] for _ in range(4)]
    assert results == [True, True, True, False]


def test_the_window_resets_at_its_boundary(client, admin_headers, clock):
    """The fixed clock stands at 12:00:00.000 UTC, a multiple of the hour."""
    agent = new_agent(client, admin_headers, budget(1000))
    assert refund(client, admin_headers, agent, 1000)["allowed"] is True
    clock.advance(3598.9)  # 12:59:58.9 and a little
    denied = refund(client, admin_headers, agent, 1)
    assert denied["allowed"] is False
    assert denied["retryAfterSeconds"] == 2
    assert "1000 spent, this call 1" in denied["reason"]
    clock.advance(1.1)  # past 13:00:00
    assert refund(client, admin_headers, agent, 1000)["allowed"] is True


def test_session_counters_are_independent_and_a_session_is_required(client, admin_headers):
    agent = new_agent(client, admin_headers, budget(500, per="session"))
    first = refund(client, admin_headers, agent, 500, session_id="chat-1")
    assert (first["allowed"], first["sessionId"]) == (True, "chat-1")
    assert refund(client, admin_headers, agent, 1, session_id="chat-1")["allowed"] is False
    assert refund(client, admin_headers, agent, 500, session_id="chat-2")["allowed"] is True
    missing = refund(client, admin_headers, agent, 1)
    assert (missing["allowed"], missing["ruleIndex"]) == (False, 0)
    assert "sessionId" not in missing
    assert missing["reason"].endswith("(budget): session required")
    assert "retryAfterSeconds" not in missing


@pytest.mark.parametrize(
    "session_id",
    ["", "x" * 256, "tab\there", "caf\u00e9", 7, None],
    ids=["empty", "256 chars", "control", "non-ASCII", "number", "null"],
)
def test_a_bad_session_id_is_refused_and_nothing_is_recorded(client, admin_headers, session_id):
    agent = new_agent(client, admin_headers, budget(500, per="session"))
    body = {"agent_id": agent, "tool_name": "payments.refund", "parameters": {"amount": 1}}
    answer = client.post(
        "/v1/authorize", json={**body, "session_id": session_id}, headers=admin_headers
    )
    assert answer.status_code == 400
    assert answer.json["error"]["code"] == "VALIDATION_ERROR"
    entries = client.get("/v1/audit-logs", query_string={"agent_id": agent}, headers=admin_headers)
    assert entries.json["data"] == []


def test_audit_entries_name_their_session_and_filter_by_it(client, admin_headers, workspace):
    agent = new_agent(client, admin_headers, budget(500, per="session"))
    refund(client, admin_headers, agent, 1, session_id="chat 1")
    refund(client, admin_headers, agent, 2, session_id="chat-2")
    refund(client, admin_headers, agent, 3)
    auditor = bearer(workspace.key("read-only"))
    everything = client.get("/v1/audit-logs", headers=auditor).json["data"]
    assert [e["sessionId"] for e in everything] == [None, "chat-2", "chat 1"]
    one = client.get("/v1/audit-logs", query_string={"session_id": "chat 1"}, headers=auditor)
    assert [e["parameters"] for e in one.json["data"]] == [{"amount": 1}]
    exported = client.get(
        "/v1/audit-logs/export", query_string={"session_id": "chat-2"}, headers=auditor
    )
    rows = list(csv.reader(io.StringIO(exported.get_data(as_text=True))))
    assert [row[6] for row in rows[1:]] == ['{"amount":2}']
    lines = client.get(
        "/v1/audit-logs/export",
        query_string={"session_id": "chat-2", "format": "jsonl"},
        headers=auditor,
    ).get_data(as_text=True)
    assert [json.loads(line)["sessionId"] for line in lines.splitlines()] == ["chat-2"]
    bad = client.get("/v1/audit-logs", query_string={"session_id": "x" * 256}, headers=auditor)
    assert bad.status_code == 400


def test_usage_shows_each_limit_of_the_agent(client, admin_headers, workspace, clock):
    limit = {"type": "rate_limit", "rateLimit": {"maxCalls": 10, "windowSeconds": 60}}
    agent = new_agent(
        client, admin_headers, limit, budget(1000), budget(1.5, per="session", window=60)
    )
    assert refund(client, admin_headers, agent, 1, session_id="s-1")["allowed"] is True
    assert refund(client, admin_headers, agent, 0.25, session_id="s-1")["allowed"] is True
    auditor = bearer(workspace.key("read-only"))
    url = f"/v1/agents/{agent}/usage"
    plain = client.get(url, headers=auditor)
    assert plain.status_code == 200
    rate, total, session = plain.json["data"]
    assert (rate["type"], rate["per"], rate["used"], rate["limit"], rate["remaining"]) == (
        "rate_limit",
        "agent",
        2,
        10,
        8,
    )
    assert rate["parameter"] is None
    assert (total["used"], total["limit"], total["remaining"]) == (1.25, 1000, 998.75)
    assert total["windowStart"] == "2026-11-21T12:00:00.000000Z"
    assert (total["windowSeconds"], total["parameter"]) == (3600, "amount")
    assert (session["per"], session["used"], session["remaining"], session["limit"]) == (
        "session",
        None,
        None,
        1.5,
    )
    asked = client.get(url, query_string={"session_id": "s-1"}, headers=auditor).json["data"]
    assert (asked[2]["used"], asked[2]["remaining"]) == (1.25, 0.25)
    other = client.get(url, query_string={"session_id": "s-2"}, headers=auditor).json["data"]
    assert (other[2]["used"], other[2]["remaining"]) == (0, 1.5)
    clock.advance(60)
    later = client.get(url, query_string={"session_id": "s-1"}, headers=auditor).json["data"]
    assert [item["used"] for item in later] == [0, 1.25, 0]


def test_usage_of_an_unknown_agent_or_with_a_bad_session_is_refused(client, admin_headers):
    agent = new_agent(client, admin_headers, budget(10))
    missing = client.get(
        "/v1/agents/00000000-0000-4000-8000-000000000000/usage", headers=admin_headers
    )
    assert missing.status_code == 404
    bad = client.get(
        f"/v1/agents/{agent}/usage", query_string={"session_id": ""}, headers=admin_headers
    )
    assert bad.status_code == 400
    unknown = client.get(
        f"/v1/agents/{agent}/usage", query_string={"window": "1"}, headers=admin_headers
    )
    assert unknown.status_code == 400


def test_session_counters_go_once_their_window_is_over(client, admin_headers, app, clock):
    agent = new_agent(client, admin_headers, budget(10, per="session", window=60), budget(100))
    policy = policy_of(client, admin_headers, agent)
    refund(client, admin_headers, agent, 1, session_id="old")
    clock.advance(60)
    refund(client, admin_headers, agent, 1, session_id="current")
    db = app.extensions["agentauth"].db

    def names() -> list[str]:
        with db.transaction() as session:
            found = session.scalars(select(CounterRow.name))
            return sorted(n for n in found if n.startswith(f"rule:{policy}:"))

    assert len(names()) == 3  # the agent's budget and two sessions'
    sweep(db, clock)
    assert [n.split(":session:")[0] for n in names()] == [f"rule:{policy}:0", f"rule:{policy}:1"]
    usage = client.get(
        f"/v1/agents/{agent}/usage", query_string={"session_id": "current"}, headers=admin_headers
    ).json["data"]
    assert [item["used"] for item in usage] == [1, 2]  # the current session's window stays
    clock.advance(60)
    sweep(db, clock)
    assert names() == [f"rule:{policy}:1"]  # the agent's own counter is never swept


def policy_of(client: Any, headers: dict[str, str], agent: str) -> str:
    found = client.get("/v1/policies", query_string={"agent_id": agent}, headers=headers)
    return str(found.json["data"][0]["id"])


@pytest.mark.parametrize(
    "budget_spec",
    [
        {"parameter": "amount", "max": 0.0000001, "windowSeconds": 60},  # below one unit
        {"parameter": "amount", "max": 0, "windowSeconds": 60},
        {"parameter": "amount", "max": 10**12 + 1, "windowSeconds": 60},
        {"parameter": "amount", "max": 10, "windowSeconds": 2_592_001},
        {"parameter": "", "max": 10, "windowSeconds": 60},
        {"max": 10, "windowSeconds": 60},
    ],
    ids=["below a millionth", "zero", "over 10^12", "over 30 days", "empty name", "no parameter"],
)
def test_a_budget_the_engine_could_not_count_is_refused(client, admin_headers, budget_spec):
    agent = client.post("/v1/agents", json={"name": "bot"}, headers=admin_headers).json["id"]
    rules = [{"type": "budget", "budget": budget_spec}, {"type": "tool_allowlist"}]
    body = {"agent_id": agent, "name": "spend", "rules": rules}
    answer = client.post("/v1/policies", json=body, headers=admin_headers)
    assert answer.status_code == 400
    assert answer.json["error"]["code"] == "VALIDATION_ERROR"
    listed = client.get("/v1/policies", query_string={"agent_id": agent}, headers=admin_headers)
    assert listed.json["data"] == []


@pytest.mark.parametrize(
    "rule",
    [
        {"type": "tool_allowlist", "per": "session"},
        {
            "type": "rate_limit",
            "per": "conversation",
            "rateLimit": {"maxCalls": 1, "windowSeconds": 1},
        },
        {"type": "rate_limit", "budget": {"parameter": "a", "max": 1, "windowSeconds": 1}},
    ],
    ids=["per on an allowlist", "unknown per", "budget on a rate limit"],
)
def test_per_and_budget_only_where_they_belong(client, admin_headers, rule):
    agent = client.post("/v1/agents", json={"name": "bot"}, headers=admin_headers).json["id"]
    body = {"agent_id": agent, "name": "p", "rules": [rule]}
    assert client.post("/v1/policies", json=body, headers=admin_headers).status_code == 400
