"""``/v1/authorize`` is served by one endpoint outside Flask's views (``api.authorize``): every
answer, refusals included, must look to a caller as any other endpoint's does: the error shape
and codes, the request id, ``nosniff``, the rate-limit headers once the key is known, one access
line, and a count against the key for every request past its check."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from core.config import Settings
from tests.api.helpers import make_agent
from tests.conftest import Tenant, bearer

LIMIT = 4  # requests per key per minute, so that the key budget runs out in a test


@pytest.fixture
def settings(database_url: str) -> Settings:
    return Settings(database_url=database_url, rate_limit_per_minute=LIMIT)


def _access_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [json.loads(r.getMessage()) for r in caplog.records if r.name == "agentauth.access"]


JSON = {"content_type": "application/json"}
#: each refusal before the decision: the call, and the status and code it gets
REFUSED: dict[str, tuple[dict[str, Any], int, str]] = {
    "no key": ({"json": {"agent_id": "x", "tool_name": "t"}, "headers": {}}, 401, "UNAUTHORIZED"),
    "an unknown key": (
        {"json": {"agent_id": "x", "tool_name": "t"}, "headers": bearer("svc_" + "0" * 32)},
        401,
        "UNAUTHORIZED",
    ),
    "an invalid body": ({"json": {"agent_id": 1, "tool_name": "t"}}, 400, "VALIDATION_ERROR"),
    "not JSON": ({"data": b"{nope", **JSON}, 400, "VALIDATION_ERROR"),
    "duplicate keys": (
        {"data": b'{"agent_id":"a","agent_id":"b","tool_name":"t"}', **JSON},
        400,
        "VALIDATION_ERROR",
    ),
    "not UTF-8": (
        {"data": b'{"agent_id":"\xff","tool_name":"t"}', **JSON},
        400,
        "VALIDATION_ERROR",
    ),
    "a query string": (
        {"json": {"agent_id": "x", "tool_name": "t"}, "query": "dry_run=1"},
        400,
        "VALIDATION_ERROR",
    ),
    "text/plain": (
        {"data": b'{"agent_id":"x","tool_name":"t"}', "content_type": "text/plain"},
        400,
        "VALIDATION_ERROR",
    ),
    "too large": ({"data": b" " * 2_000_000, **JSON}, 413, "PAYLOAD_TOO_LARGE"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_refused_call_is_answered_as_any_endpoint_answers(case, app, workspace, caplog):
    call, status, code = dict(REFUSED[case][0]), REFUSED[case][1], REFUSED[case][2]
    headers = call.pop("headers", workspace.headers("admin"))
    path = "/v1/authorize?" + call.pop("query", "")
    with caplog.at_level(logging.INFO, logger="agentauth.access"):
        response = app.test_client().post(path, headers=headers, **call)
    assert response.status_code == status
    assert response.json["error"]["code"] == code
    assert response.headers["Content-Type"] == "application/json"
    assert response.headers["Content-Length"] == str(len(response.get_data()))
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["X-Request-Id"]
    lines = _access_lines(caplog)
    assert [(line["method"], line["path"], line["status"]) for line in lines] == [
        ("POST", "/v1/authorize", status)
    ]
    assert lines[0]["request_id"] == response.headers["X-Request-Id"]
    if status == 401:  # nobody to count against
        assert "X-RateLimit-Remaining" not in response.headers
        assert lines[0]["key_id"] is None
    else:  # counted against the key, as a refusal by any endpoint is
        assert response.headers["X-RateLimit-Limit"] == str(LIMIT)
        assert response.headers["X-RateLimit-Remaining"] == str(LIMIT - 1)
        assert lines[0]["key_id"]


def test_the_query_parameter_is_named(app, workspace):
    response = app.test_client().post(
        "/v1/authorize?dry_run=1", json={"agent_id": "x", "tool_name": "t"},
        headers=workspace.headers("admin"),
    )  # fmt: skip
    assert response.json["error"]["details"] == [
        {"field": "dry_run", "message": "unknown query parameter"}
    ]


def test_calls_count_against_the_key_until_its_minute_is_full(app, workspace, caplog):
    client = app.test_client()
    headers = workspace.headers("admin")
    agent_id = make_agent(client, headers, "counted", [{"type": "tool_allowlist", "tools": ["*"]}])
    body = {"agent_id": agent_id, "tool_name": "calendar.create"}
    # the agent and policy took 2 of the key's 4; one refused call and one decision take 2 more
    with caplog.at_level(logging.INFO, logger="agentauth.access"):
        caplog.clear()
        refused = client.post("/v1/authorize", json={"agent_id": 1}, headers=headers)
        allowed = client.post("/v1/authorize", json=body, headers=headers)
        spent = client.post("/v1/authorize", json=body, headers=headers)
    assert (refused.status_code, allowed.status_code) == (400, 200)
    assert allowed.json["allowed"] is True
    assert allowed.headers["X-RateLimit-Remaining"] == "0"
    assert spent.status_code == 429
    assert spent.json["error"]["code"] == "RATE_LIMITED"
    assert int(spent.headers["Retry-After"]) >= 1
    assert [line["status"] for line in _access_lines(caplog)] == [400, 200, 429]


@pytest.mark.parametrize("method", ["GET", "PUT", "PATCH", "DELETE", "HEAD"])
def test_another_method_is_405_naming_what_is_allowed(app, workspace, method):
    response = app.test_client().open(
        "/v1/authorize", method=method, headers=workspace.headers("admin")
    )
    assert response.status_code == 405
    assert response.headers["Allow"] == "OPTIONS, POST"
    if method != "HEAD":
        assert response.json["error"]["code"] == "METHOD_NOT_ALLOWED"


def test_options_needs_a_key_and_names_the_methods(app, workspace):
    client = app.test_client()
    assert client.options("/v1/authorize").status_code == 401
    response = client.options("/v1/authorize", headers=workspace.headers("admin"))
    assert response.status_code == 200
    assert response.headers["Allow"] == "OPTIONS, POST"
    assert response.get_data() == b""


def test_only_the_exact_path_is_the_endpoints(app, workspace):
    """Flask has no route for it, and a neighbouring path is Flask's 404 as any unknown one."""
    assert not [rule for rule in app.url_map.iter_rules() if "authorize" in rule.rule]
    for path in ("/v1/authorize/", "//v1/authorize", "/v1/authorizex"):
        response = app.test_client().post(path, json={}, headers=workspace.headers("admin"))
        assert response.status_code == 404, path
        assert response.json["error"]["code"] == "NOT_FOUND"


def test_a_body_shorter_than_announced_is_refused(app, workspace):
    body = b'{"agent_id":"x","tool_name":"t"}'
    environ = {"CONTENT_LENGTH": str(len(body) + 10), "CONTENT_TYPE": "application/json"}
    response = app.test_client().post(
        "/v1/authorize", data=body, headers=workspace.headers("admin"), environ_overrides=environ
    )
    assert response.status_code == 400
    assert response.json["error"]["code"] == "VALIDATION_ERROR"


class _Trickle:
    """A request stream that hands the body over a few bytes per read, as a server may."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self, size: int = -1) -> bytes:
        size = len(self.data) if size < 0 else min(size, 7)
        part, self.data = self.data[:size], self.data[size:]
        return part


def test_a_body_read_in_pieces_is_served_whole(app, workspace):
    headers = workspace.headers("admin")
    client = app.test_client()
    agent_id = make_agent(client, headers, "trickle", [{"type": "tool_allowlist", "tools": ["*"]}])
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


class _Broken:
    """A request stream whose client goes away after a few bytes."""

    def __init__(self, data: bytes) -> None:
        self.data = data[:5]

    def read(self, size: int = -1) -> bytes:
        if self.data:
            part, self.data = self.data, b""
            return part
        raise ConnectionResetError("the client went away")


def test_a_client_gone_mid_body_gets_400_and_an_access_line(app, workspace, caplog):
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
    assert [(line["path"], line["status"]) for line in _access_lines(caplog)] == [
        ("/v1/authorize", 400)
    ]


def test_a_database_failure_at_the_key_lookup_is_a_500_after_one_lookup(app, monkeypatch):
    import core.store.keys
    from core.domain.errors import StorageError

    lookups: list[str] = []

    def unavailable(*_args: Any) -> Any:
        lookups.append("key")
        raise StorageError("the database connection was lost")

    monkeypatch.setattr(core.store.keys, "authenticate", unavailable)
    key = {"Authorization": "Bearer svc_" + "0" * 32}  # a key's shape: looked up
    response = app.test_client().post(
        "/v1/authorize", json={"agent_id": "x", "tool_name": "t"}, headers=key
    )
    assert response.status_code == 500
    assert response.json["error"]["code"] == "INTERNAL_ERROR"
    assert lookups == ["key"]


def test_in_debug_mode_the_answer_is_indented_as_flasks_are(app, clock):
    app.debug = True
    client = app.test_client()
    headers = bearer(Tenant(app, "debug", clock).key("admin"))
    agent_id = make_agent(client, headers, "debug", [{"type": "tool_denylist", "tools": ["*"]}])
    body = {"agent_id": agent_id, "tool_name": "calendar.create"}
    text = client.post("/v1/authorize", json=body, headers=headers).get_data(as_text=True)
    listed = client.get("/v1/agents", headers=headers).get_data(as_text=True)
    assert text.splitlines()[:2] == ["{", '  "allowed": false,']
    assert listed.splitlines()[0] == "{"


def test_a_body_is_parsed_only_once_its_key_was_found(app, workspace, monkeypatch):
    """A key of the right shape that is nobody's gets its 401 without its body being parsed:
    parsing a long body is work that only a caller with a key may cost the service."""
    import api.authorize

    parsed: list[int] = []
    parse = api.authorize.parse_body

    def counting(raw: bytes, ref: str) -> Any:
        parsed.append(len(raw))
        return parse(raw, ref)

    monkeypatch.setattr(api.authorize, "parse_body", counting)
    client = app.test_client()
    body = {"agent_id": "x", "tool_name": "t", "parameters": {"a": [{}] * 1000}}
    nobody = client.post("/v1/authorize", json=body, headers=bearer("svc_" + "0" * 32))
    assert nobody.status_code == 401
    assert parsed == []
    known = client.post("/v1/authorize", json=body, headers=workspace.headers("admin"))
    assert known.status_code == 400  # agent_id is not a UUID
    assert len(parsed) == 1


@pytest.mark.parametrize("valid", [True, False], ids=["decided", "refused"])
def test_a_long_body_is_decided_or_refused_as_a_short_one(app, workspace, valid):
    client = app.test_client()
    headers = workspace.headers("admin")
    agent_id = make_agent(client, headers, "long", [{"type": "tool_allowlist", "tools": ["*"]}])
    note = "n" * 40_000  # past what is parsed on the recorder's thread
    body: dict[str, Any] = {"agent_id": agent_id, "tool_name": "t", "parameters": {"note": note}}
    if not valid:
        body["unexpected"] = True
    response = client.post("/v1/authorize", json=body, headers=headers)
    if valid:
        assert response.status_code == 200
        assert response.json["allowed"] is True
    else:
        assert response.status_code == 400
        assert response.json["error"]["code"] == "VALIDATION_ERROR"
    assert response.headers["X-RateLimit-Remaining"] == str(LIMIT - 3)  # counted, once


def test_a_refusal_whose_count_cannot_be_written_is_still_the_refusal(app, workspace, monkeypatch):
    from core.hotpath.recorder import Recorder

    def no_writes(*_args: Any) -> None:
        raise RuntimeError("database or disk is full")

    monkeypatch.setattr(Recorder, "_locked_transaction", no_writes)
    client = app.test_client()
    headers = workspace.headers("admin")
    refused = client.post("/v1/authorize", json={"agent_id": 1}, headers=headers)
    assert refused.status_code == 400
    assert "X-RateLimit-Remaining" not in refused.headers  # not counted: it could not be
    decided = client.post(
        "/v1/authorize", json={"agent_id": "x", "tool_name": "t"}, headers=headers
    )
    assert decided.status_code == 400  # agent_id must be a UUID: refused too
    agent = "00000000-0000-4000-8000-000000000000"
    failed = client.post(
        "/v1/authorize", json={"agent_id": agent, "tool_name": "t"}, headers=headers
    )
    assert failed.status_code == 500  # a decision that cannot be recorded is never answered


def test_a_call_cancelled_while_it_waits_leaves_nothing_in_hand(app, workspace, monkeypatch):
    """On the server's event loop a call may be cancelled while it waits for its batch: it must
    not stay counted in hand (every later batch would wait for it) nor in flight."""
    import asyncio

    from werkzeug.test import EnvironBuilder

    from api import metrics

    endpoint = app.wsgi_app.endpoint
    recorder = app.extensions["agentauth"].recorder

    async def cancelled(**_how: Any) -> Any:
        raise asyncio.CancelledError

    monkeypatch.setattr(recorder, "arun", cancelled)
    environ = EnvironBuilder(
        path="/v1/authorize", method="POST", json={"agent_id": "x", "tool_name": "t"},
        headers=workspace.headers("admin"),
    ).get_environ()  # fmt: skip
    in_flight = metrics.IN_FLIGHT._value.get()
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(endpoint.answer(environ))
    assert endpoint._calls_in_hand() == 0
    assert metrics.IN_FLIGHT._value.get() == in_flight
