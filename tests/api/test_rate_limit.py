"""Per-key rate limits: headers, 429 with Retry-After, fixed windows, and exactness across
several worker processes sharing the database."""

from __future__ import annotations

from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from api import create_app
from tests.conftest import bearer
from tests.server import running_server

LIMIT = 5


@pytest.fixture
def settings(database_url):
    from core.config import Settings

    return Settings(database_url=database_url, rate_limit_per_minute=LIMIT)


def test_headers_count_down_then_429_with_retry_after(client, admin_headers, clock):
    seen = [client.get("/v1/agents", headers=admin_headers) for _ in range(LIMIT + 1)]
    assert [r.status_code for r in seen] == [200] * LIMIT + [429]
    assert [r.headers["X-RateLimit-Remaining"] for r in seen] == ["4", "3", "2", "1", "0", "0"]
    assert {r.headers["X-RateLimit-Limit"] for r in seen} == {str(LIMIT)}
    window_end = (int(clock.moment.timestamp()) // 60 + 1) * 60
    assert {r.headers["X-RateLimit-Reset"] for r in seen} == {str(window_end)}
    limited = seen[-1]
    assert limited.json["error"]["code"] == "RATE_LIMITED"
    assert 1 <= int(limited.headers["Retry-After"]) <= 60


def test_a_new_window_starts_afresh(client, admin_headers, clock):
    for _ in range(LIMIT):
        client.get("/v1/agents", headers=admin_headers)
    assert client.get("/v1/agents", headers=admin_headers).status_code == 429
    clock.advance(60)
    assert client.get("/v1/agents", headers=admin_headers).status_code == 200


def test_limits_are_per_key(client, workspace):
    first, second = workspace.headers("admin"), workspace.headers("read-only")
    for _ in range(LIMIT):
        client.get("/v1/agents", headers=first)
    assert client.get("/v1/agents", headers=first).status_code == 429
    assert client.get("/v1/agents", headers=second).status_code == 200


def test_requests_without_a_valid_key_get_no_rate_headers(client):
    response = client.get("/v1/agents", headers=bearer("svc_" + "0" * 32))
    assert response.status_code == 401
    assert "X-RateLimit-Limit" not in response.headers


@pytest.mark.slow
def test_exact_across_worker_processes(database_url, settings, clock):
    """Three server workers, many concurrent requests: in every one-minute window exactly
    min(requests, limit) succeed."""
    app = create_app(settings)
    from tests.conftest import Tenant

    key = Tenant(app, "rate-mp", clock).key("read-only")
    app.extensions["agentauth"].close()
    env = {"AGENTAUTH_RATE_LIMIT_PER_MINUTE": str(LIMIT * 4)}
    with (
        running_server(database_url, workers=3, threads=4, env=env) as base,
        httpx.Client(base_url=base, headers=bearer(key), timeout=30) as http,
        ThreadPoolExecutor(max_workers=12) as pool,
    ):
        responses = list(pool.map(lambda _: http.get("/v1/agents"), range(LIMIT * 12)))
    per_window: dict[str, Counter[int]] = defaultdict(Counter)
    for response in responses:
        per_window[response.headers["X-RateLimit-Reset"]][response.status_code] += 1
    for counts in per_window.values():
        assert set(counts) <= {200, 429}
        assert counts[200] == min(LIMIT * 4, counts[200] + counts[429])


def test_authorize_counts_against_the_key_even_when_it_fails_early(client, workspace):
    """Authorize takes its slot inside the decision's transaction; a request refused before
    that (a bad body) is still counted, and past the limit nothing is decided or audited."""
    admin_headers, auditor = workspace.headers("admin"), workspace.headers("read-only")
    good = {"agent_id": "0f8fad5b-d9cb-469f-a165-70867728950e", "tool_name": "x"}
    statuses = []
    for body in (good, {"tool_name": "x"}, good, {}, good, good):
        response = client.post("/v1/authorize", json=body, headers=admin_headers)
        statuses.append((response.status_code, response.headers.get("X-RateLimit-Remaining")))
    assert statuses == [
        (200, "4"), (400, "3"), (200, "2"), (400, "1"), (200, "0"), (429, "0"),
    ]  # fmt: skip
    assert client.get("/v1/audit-logs", headers=admin_headers).status_code == 429
    audited = client.get("/v1/audit-logs", headers=auditor).json["pagination"]["total"]
    assert audited == 3
