"""``POST /v1/authorize`` is served by a fast path in front of Flask for well-formed calls, and by
Flask for everything else. A caller must not be able to tell which one answered: the same
status, headers (in the same order) and body, the same access line and the same counts, for
every kind of answer; and the calls the fast path leaves to Flask reach it unchanged."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask

from api import create_app
from api.authorize import FastPath
from core.config import Settings
from tests.api.helpers import make_agent
from tests.conftest import FakeClock, Tenant, bearer

LIMIT = 4  # requests per key per minute, so that the key budget runs out in a test
NAMED = {"Content-Type", "Retry-After", "X-RateLimit-Limit", "X-RateLimit-Remaining",
         "X-RateLimit-Reset"}  # fmt: skip
VOLATILE = {"auditId", "latencyMs", "policyId"}  # ids of each path's own objects, and timing


@pytest.fixture
def settings(database_url: str) -> Settings:
    return Settings(database_url=database_url, rate_limit_per_minute=LIMIT)


@pytest.fixture
def flask_only(settings: Settings, clock: FakeClock) -> Iterator[Flask]:
    """The same service with the fast path taken out: Flask serves every call."""
    app = create_app(settings, clock=clock)
    assert isinstance(app.wsgi_app, FastPath)
    app.wsgi_app = app.wsgi_app.inner  # type: ignore[method-assign]
    yield app
    app.extensions["agentauth"].close()


@pytest.fixture
def handed_on(app: Flask) -> list[str]:
    """The paths of the calls the fast path handed to Flask."""
    seen: list[str] = []
    fast = app.wsgi_app
    assert isinstance(fast, FastPath)
    inner = fast.inner

    def counting(environ: dict[str, Any], start_response: Any) -> Any:
        if environ["PATH_INFO"] == "/v1/authorize":
            seen.append(environ["REQUEST_METHOD"])
        return inner(environ, start_response)

    fast.inner = counting
    return seen


def _answer(response: Any) -> tuple[int, list[tuple[str, str]], Any]:
    assert response.headers["Content-Length"] == str(len(response.get_data()))
    assert response.headers["X-Request-Id"]
    # the length follows latencyMs's digits; the request id is new each time
    headers = [(k, v) for k, v in response.headers.items() if k in NAMED]
    headers += [(k, "") for k, _ in response.headers.items() if k not in NAMED]
    body = response.get_json(silent=True)
    if isinstance(body, dict):
        body = {k: (v if k not in VOLATILE else v is not None) for k, v in body.items()}
    return response.status_code, headers, body if body is not None else response.get_data()


RULES: dict[str, list[dict[str, Any]]] = {
    "allowed": [{"type": "tool_allowlist", "tools": ["calendar.*"]}],
    "denied": [{"type": "tool_denylist", "tools": ["calendar.*"]}],
    "rule rate limit": [
        {"type": "rate_limit", "rateLimit": {"maxCalls": 1, "windowSeconds": 60}},
        {"type": "tool_allowlist", "tools": ["calendar.*"]},
    ],
}


@pytest.mark.parametrize("case", ["allowed", "denied", "rule rate limit", "unknown agent",
                                  "suspended agent", "key budget spent"])  # fmt: skip
def test_both_paths_answer_alike(case, app, flask_only, clock, handed_on, caplog):
    """Each path gets a workspace of its own, built the same way, and the same calls; up to the
    key budget (LIMIT), so the last one is a 429 with Retry-After."""
    answers = []
    for served_by in (app, flask_only):
        client = served_by.test_client()
        tenant = Tenant(served_by, f"paths-{case}-{id(served_by)}", clock)
        headers = bearer(tenant.key("admin"))
        agent_id = make_agent(client, headers, "paths", RULES.get(case, RULES["allowed"]))
        if case == "suspended agent":
            path = f"/v1/agents/{agent_id}"
            patched = client.patch(path, json={"status": "suspended"}, headers=headers)
            assert patched.status_code == 200
        if case == "unknown agent":
            agent_id = "00000000-0000-4000-8000-000000000000"
        calls = LIMIT - (3 if case == "suspended agent" else 2) + (1 if "budget" in case else 0)
        body = {"agent_id": agent_id, "tool_name": "calendar.create", "parameters": {"n": 1}}
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="agentauth.access"):
            got = [client.post("/v1/authorize", json=body, headers=headers) for _ in range(calls)]
        lines = [r.getMessage() for r in caplog.records if r.name == "agentauth.access"]
        answers.append(([_answer(r) for r in got], [_access_fields(line) for line in lines]))
    assert answers[0] == answers[1]
    statuses = [status for status, _, _ in answers[0][0]]
    assert statuses[-1] == (429 if "budget" in case else 200)
    assert handed_on == [], "a well-formed call was handed to Flask"


def _access_fields(line: str) -> tuple[Any, ...]:
    record = json.loads(line)
    assert record["request_id"]
    assert record["key_id"]
    assert record["workspace"]
    assert isinstance(record["duration_ms"], float)
    return record["level"], record["method"], record["path"], record["status"]


JSON = {"content_type": "application/json"}
CALLS_FOR_FLASK: dict[str, dict[str, Any]] = {
    "no key": {"json": {"agent_id": "x", "tool_name": "t"}, "headers": {}},
    "a revoked-looking key": {
        "json": {"agent_id": "x", "tool_name": "t"},
        "headers": bearer("svc_" + "0" * 32),
    },
    "an invalid body": {"json": {"agent_id": 1, "tool_name": "t"}},
    "not JSON": {"data": b"{nope", **JSON},
    "duplicate keys": {"data": b'{"agent_id":"a","agent_id":"b","tool_name":"t"}', **JSON},
    "not UTF-8": {"data": b'{"agent_id":"\xff","tool_name":"t"}', **JSON},
    "a query string": {"json": {"agent_id": "x", "tool_name": "t"}, "query": "dry_run=1"},
    "text/plain": {"data": b'{"agent_id":"x","tool_name":"t"}', "content_type": "text/plain"},
    "too large": {"data": b" " * 2_000_000, **JSON},
}


@pytest.mark.parametrize("case", sorted(CALLS_FOR_FLASK))
def test_calls_refused_before_the_decision_are_flasks_and_answered_alike(
    case, app, flask_only, clock, handed_on
):
    answers = []
    for served_by in (app, flask_only):  # a key of each path's own: the counts start alike
        call = dict(CALLS_FOR_FLASK[case])
        key = Tenant(served_by, f"refused-{case}-{id(served_by)}", clock).key("admin")
        headers = call.pop("headers", bearer(key))
        path = "/v1/authorize?" + call.pop("query", "")
        answers.append(_answer(served_by.test_client().post(path, headers=headers, **call)))
    assert answers[0] == answers[1]
    assert 400 <= answers[0][0] < 500
    assert handed_on == ["POST"]


def test_a_body_shorter_than_announced_is_refused(app, workspace, handed_on):
    body = b'{"agent_id":"x","tool_name":"t"}'
    environ = {"CONTENT_LENGTH": str(len(body) + 10), "CONTENT_TYPE": "application/json"}
    response = app.test_client().post(
        "/v1/authorize", data=body, headers=workspace.headers("admin"), environ_overrides=environ
    )
    assert response.status_code == 400
    assert handed_on == ["POST"]


class _Trickle:
    """A request stream that hands the body over a few bytes per read, as a server may."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self, size: int = -1) -> bytes:
        size = len(self.data) if size < 0 else min(size, 7)
        part, self.data = self.data[:size], self.data[size:]
        return part


def test_a_body_read_in_pieces_is_served_whole(app, workspace, handed_on):
    headers = workspace.headers("admin")
    client = app.test_client()
    agent_id = make_agent(client, headers, "trickle", RULES["allowed"])
    body = json.dumps({"agent_id": agent_id, "tool_name": "calendar.create"}).encode()
    response = client.post(
        "/v1/authorize",
        data=body,
        headers=headers,
        content_type="application/json",
        environ_overrides={"wsgi.input": _Trickle(body)},
    )
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.json["allowed"] is True
    assert handed_on == []


class _Broken:
    """A request stream whose client goes away after a few bytes."""

    def __init__(self, data: bytes) -> None:
        self.data = data[:5]

    def read(self, size: int = -1) -> bytes:
        if self.data:
            part, self.data = self.data, b""
            return part
        raise ConnectionResetError("the client went away")


def test_a_client_gone_mid_body_gets_flasks_400_and_an_access_line(
    app, workspace, handed_on, caplog
):
    body = b'{"agent_id":"x","tool_name":"t"}'
    with caplog.at_level(logging.INFO, logger="agentauth.access"):
        response = app.test_client().post(
            "/v1/authorize",
            data=body,
            headers=workspace.headers("admin"),
            content_type="application/json",
            environ_overrides={"wsgi.input": _Broken(body)},
        )
    assert response.status_code == 400
    assert response.json["error"]["code"] == "VALIDATION_ERROR"
    assert handed_on == ["POST"]
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "agentauth.access"]
    assert [(line["path"], line["status"]) for line in lines] == [("/v1/authorize", 400)]


def test_a_database_failure_at_the_key_lookup_is_answered_once(
    app, flask_only, workspace, handed_on, monkeypatch
):
    """The fast path answers it itself: Flask would look the key up, and wait for an
    unavailable database, a second time."""
    import core.store.keys
    from core.domain.errors import StorageError

    lookups: list[str] = []

    def unavailable(*_args: Any) -> Any:
        lookups.append("key")
        raise StorageError("the database connection was lost")

    monkeypatch.setattr(core.store.keys, "authenticate", unavailable)
    body = {"agent_id": "x", "tool_name": "t"}
    key = {"Authorization": "Bearer svc_" + "0" * 32}  # a key's shape: looked up
    answers = []
    for served_by in (app, flask_only):
        lookups.clear()
        response = served_by.test_client().post("/v1/authorize", json=body, headers=key)
        answers.append((_answer(response), len(lookups)))
    assert answers[0] == answers[1]
    assert answers[0][0][0] == 500
    assert answers[0][1] == 1
    assert handed_on == []


def test_in_debug_mode_both_paths_indent_alike(app, flask_only, clock):
    answers = []
    for served_by in (app, flask_only):
        served_by.debug = True
        client = served_by.test_client()
        headers = bearer(Tenant(served_by, f"debug-{id(served_by)}", clock).key("admin"))
        agent_id = make_agent(client, headers, "debug", RULES["denied"])
        body = {"agent_id": agent_id, "tool_name": "calendar.create"}
        text = client.post("/v1/authorize", json=body, headers=headers).get_data(as_text=True)
        answers.append(
            [line for line in text.splitlines() if "Id" not in line and "latency" not in line]
        )
    assert answers[0] == answers[1]
    assert answers[0][0] == "{"
