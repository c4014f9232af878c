"""Issue #22, finding 9: no response body ever holds an API key of this service, even one the
caller sent where a name goes (a body member, a nested member, a duplicate member, a query
parameter, a path segment) or where a value goes that an error message repeats.

Each request is refused exactly as before (same status, same code, the same field named); only
the key is masked. The keys sent are a real key of the caller's workspace, a made-up one, and a
made-up one in capitals; the request's access log line must not hold them either.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from core.domain.redaction import MASK


@dataclass(frozen=True)
class Case:
    """A request that carries ``key`` somewhere, and how it is refused."""

    method: str
    path: Callable[[str, str], str]  # (key, agent id) -> path and query string
    body: Callable[[str, str], Any] | None  # (key, agent id) -> JSON (a str: sent as is)
    status: int
    code: str
    field: str | None = None  # the details' field, "{mask}" where the key was


CASES = {
    "body member": Case(
        "POST", lambda k, a: "/v1/agents", lambda k, a: {"name": "x", k: 1}, 400,
        "VALIDATION_ERROR", "{mask}",
    ),
    "nested member": Case(
        "POST", lambda k, a: "/v1/policies",
        lambda k, a: {"agent_id": a, "name": "p", "rules": [{"type": "tool_allowlist", k: 1}]},
        400, "VALIDATION_ERROR", "rules[0].{mask}",
    ),
    "authorize member": Case(
        "POST", lambda k, a: "/v1/authorize",
        lambda k, a: {"agent_id": a, "tool_name": "t", k: 1}, 400, "VALIDATION_ERROR", "{mask}",
    ),
    "duplicate member": Case(
        "POST", lambda k, a: "/v1/agents", lambda k, a: f'{{"name": "x", "{k}": 1, "{k}": 2}}',
        400, "VALIDATION_ERROR", "body",
    ),
    "duplicate nested member": Case(
        "POST", lambda k, a: "/v1/authorize",
        lambda k, a: f'{{"agent_id": "{a}", "tool_name": "t", "parameters": {{"{k}": 1, "{k}": 2}}}}',  # noqa: E501 (one JSON text reads best on one line)
        400, "VALIDATION_ERROR", "body",
    ),
    "duplicate member after a long prefix": Case(  # the message shows 64 characters of it
        "POST", lambda k, a: "/v1/agents",
        lambda k, a: f'{{"name": "x", "{"n" * 30}{k}": 1, "{"n" * 30}{k}": 2}}',
        400, "VALIDATION_ERROR", "body",
    ),
    "query parameter name": Case(
        "GET", lambda k, a: f"/v1/agents?{k}=1", None, 400, "VALIDATION_ERROR", "{mask}"
    ),
    "repeated query parameter name": Case(
        "GET", lambda k, a: f"/v1/audit-logs?{k}=1&{k}=2", None, 400, "VALIDATION_ERROR",
        "{mask}",
    ),
    "query parameter value": Case(
        "GET", lambda k, a: f"/v1/audit-logs?agent_id={k}", None, 400, "VALIDATION_ERROR",
        "agent_id",
    ),
    "path segment": Case(
        "GET", lambda k, a: f"/v1/agents/{k}", None, 400, "VALIDATION_ERROR", "id"
    ),
    "unknown route": Case("GET", lambda k, a: f"/v1/{k}", None, 404, "NOT_FOUND"),
    "regex in a policy": Case(  # RE2's own message quotes the pattern
        "POST", lambda k, a: "/v1/policies",
        lambda k, a: {
            "agent_id": a, "name": "p",
            "rules": [{
                "type": "parameter_constraint", "tools": ["x"],
                "parameters": {"a": {"regex": f"({k}"}},
            }],
        },
        400, "VALIDATION_ERROR", "rules[0].parameters.a.regex",
    ),
}  # fmt: skip


@pytest.fixture(params=["issued", "made-up", "capitals"])
def key(request: pytest.FixtureRequest, workspace) -> str:
    """A key of this service: one the workspace was issued, or one of its shape."""
    if request.param == "issued":
        return str(workspace.key("read-only"))
    made_up = "svc_" + secrets.token_hex(16)
    return made_up if request.param == "made-up" else "svc_" + made_up[4:].upper()


def shows(text: str, key: str) -> bool:
    """Whether ``text`` holds the key, or 16 hex characters of it in a row (a cut key)."""
    secret, lowered = key[4:].lower(), text.lower()
    return any(secret[at : at + 16] in lowered for at in range(len(secret) - 15))


def send(client, headers, case: Case, key: str, agent: str) -> Any:
    body = None if case.body is None else case.body(key, agent)
    data = body if isinstance(body, str) else None if body is None else json.dumps(body)
    return client.open(
        case.path(key, agent),
        method=case.method,
        data=data,
        content_type=None if data is None else "application/json",
        headers=headers,
    )


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_key_sent_is_never_answered(client, admin_headers, key: str, case: Case, caplog):
    agent = client.post("/v1/agents", json={"name": "a"}, headers=admin_headers).json["id"]
    with caplog.at_level(logging.INFO, logger="agentauth.access"):
        response = send(client, admin_headers, case, key, agent)
    text = response.get_data(as_text=True)
    assert not shows(text, key), text
    assert response.status_code == case.status, text
    error = response.json["error"]
    assert error["code"] == case.code
    if case.field is not None:
        fields = [d["field"] for d in error["details"]]
        assert case.field.format(mask=MASK) in fields
    assert not shows(caplog.text, key)


def test_a_key_sent_as_a_header_is_never_answered(client, key: str):
    for value in (f"Bearer {key}0", f"Basic {key}", f"Bearer {key[:-1]}"):
        response = client.get("/v1/agents", headers={"Authorization": value})
        assert response.status_code == 401
        assert not shows(response.get_data(as_text=True), key)
    response = client.get("/v1/agents", headers={"X-Request-Id": key})
    assert not shows(response.get_data(as_text=True), key)
    assert not shows(str(response.headers), key)
