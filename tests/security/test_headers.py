"""Every answer of the API, errors included and whichever path served it, says
``X-Content-Type-Options: nosniff``, so a browser never reads a JSON error as a page or a
script (#22, seen in passing)."""

from __future__ import annotations

import pytest

from tests.api.helpers import make_agent


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("GET", "/healthz", None, 200),
        ("GET", "/v1/agents", None, 200),
        ("GET", "/v1/nowhere", None, 404),
        ("DELETE", "/healthz", None, 405),
        ("POST", "/v1/agents", {"name": "x", "unknown": 1}, 400),
        ("POST", "/v1/agents", {"name": "x" * 2_000_000}, 413),
        ("GET", "/v1/agents?limit=0", None, 400),
    ],
)
def test_every_answer_says_nosniff(client, admin_headers, method, path, body, status):
    answer = client.open(path, method=method, json=body, headers=admin_headers)
    assert answer.status_code == status
    assert answer.headers["X-Content-Type-Options"] == "nosniff"


def test_authorize_answers_say_nosniff_decided_or_refused(client, admin_headers):
    agent = make_agent(client, admin_headers)
    call = {"agent_id": agent, "tool_name": "search", "parameters": {}}
    decided = client.post("/v1/authorize", json=call, headers=admin_headers)
    refused = client.post("/v1/authorize", json=call)  # no key
    assert (decided.status_code, refused.status_code) == (200, 401)
    assert decided.headers["X-Content-Type-Options"] == "nosniff"
    assert refused.headers["X-Content-Type-Options"] == "nosniff"
