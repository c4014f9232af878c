"""AuthzClient and AsyncAuthzClient against a real server: decisions with every field, the
error classes for each kind of failure, and the key kept out of every text."""

from __future__ import annotations

import dataclasses
import json
import logging
from datetime import date
from decimal import Decimal
from enum import StrEnum

import httpx
import pytest

from agentauth import (
    AsyncAuthzClient,
    AuthzClient,
    BadRequestError,
    Decision,
    Guard,
    RateLimitError,
    ServiceUnavailableError,
    UnauthorizedError,
)
from tests.agentauth.faults import faulty_service
from tests.server import free_port, running_server


def test_an_allowed_call_carries_every_field_of_the_decision(service, api_key, agent_id):
    with AuthzClient(service, api_key) as client:
        decision = client.authorize(agent_id, "calendar.create", {"title": "standup"})
    assert isinstance(decision, Decision)
    assert decision.allowed is True
    assert decision.outcome == "allowed"
    assert decision.policy_id is not None
    assert decision.rule_index == 2  # the allowlist, third rule of the policy
    assert decision.audit_id
    assert decision.latency_ms is not None
    assert decision.latency_ms >= 0
    assert decision.retry_after_seconds is None
    assert decision.error is None
    assert decision.approval_id is None  # no approval involved
    assert decision.approval_expires_at is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        decision.allowed = False  # type: ignore[misc]


def test_a_denial_is_a_decision_not_an_error(service, api_key, agent_id):
    with AuthzClient(service, api_key) as client:
        denied = client.authorize(agent_id, "calendar.delete_all", {})
        unknown_tool = client.authorize(agent_id, "shell.exec", {"cmd": "rm -rf /"})
    assert (denied.allowed, denied.outcome, denied.rule_index) == (False, "denied", 0)
    assert (denied.approval_id, denied.approval_expires_at) == (None, None)
    assert unknown_tool.allowed is False
    assert unknown_tool.policy_id is None
    assert "default deny" in unknown_tool.reason


@pytest.mark.parametrize(
    ("parameters", "allowed"),
    [
        ({"amount": 40, "currency": "EUR"}, True),
        ({"amount": 400, "currency": "EUR"}, False),
        ({"amount": 40, "currency": "GBP"}, False),
        ({"amount": Decimal("99.50"), "currency": "USD"}, True),
        ({"amount": Decimal("100.01"), "currency": "USD"}, False),
    ],
    ids=["within", "over-max", "currency-not-listed", "decimal-within", "decimal-over"],
)
def test_parameters_reach_the_decision(service, api_key, agent_id, parameters, allowed):
    with AuthzClient(service, api_key) as client:
        decision = client.authorize(agent_id, "payments.refund", parameters)
    assert decision.allowed is allowed, decision.reason


def test_parameters_are_sent_as_json_values():
    class Tier(StrEnum):
        GOLD = "gold"

    @dataclasses.dataclass
    class Order:
        id: str
        day: date

    answer = json.dumps({"allowed": False, "outcome": "denied", "reason": "no"}).encode()
    with (
        faulty_service(200, answer) as (base, received),
        AuthzClient(base, "svc_" + "a" * 32) as client,
    ):
        client.authorize(
            "agent",
            "tool",
            {"tier": Tier.GOLD, "order": Order("o1", date(2026, 11, 21)), "ids": (1, 2)},
        )
    assert json.loads(received[0]) == {
        "agent_id": "agent",
        "tool_name": "tool",
        "parameters": {"tier": "gold", "order": {"id": "o1", "day": "2026-11-21"}, "ids": [1, 2]},
    }


def test_parameters_without_a_json_form_are_refused_before_sending():
    with (
        faulty_service(200, b"{}") as (base, received),
        AuthzClient(base, "svc_" + "a" * 32) as client,
    ):
        with pytest.raises(TypeError, match="has no JSON form"):
            client.authorize("agent", "tool", {"when": object()})
        with pytest.raises(TypeError, match="finite"):
            client.authorize("agent", "tool", {"amount": float("nan")})
    assert received == []


async def _async_decision(base, key, agent, tool, parameters):
    async with AsyncAuthzClient(base, key) as client:
        return await client.authorize(agent, tool, parameters)


@pytest.mark.anyio
async def test_the_async_client_decides_the_same(service, api_key, agent_id):
    allowed = await _async_decision(
        service, api_key, agent_id, "payments.refund", {"amount": 5, "currency": "EUR"}
    )
    denied = await _async_decision(
        service, api_key, agent_id, "payments.refund", {"amount": 500, "currency": "EUR"}
    )
    assert (allowed.allowed, denied.allowed) == (True, False)
    assert denied.rule_index == 1


def test_a_wrong_key_raises_unauthorized_without_echoing_it(service, agent_id, caplog):
    wrong = "svc_" + "0" * 32
    caplog.set_level(logging.DEBUG)
    with AuthzClient(service, wrong) as client:
        with pytest.raises(UnauthorizedError) as raised:
            client.authorize(agent_id, "calendar.create", {})
        assert wrong not in repr(client)
    error = raised.value
    assert (error.status_code, error.code) == (401, "UNAUTHORIZED")
    for text in (str(error), repr(error), error.message, caplog.text):
        assert wrong not in text
        assert "0" * 32 not in text


def test_a_malformed_request_raises_bad_request(service, api_key):
    with AuthzClient(service, api_key) as client, pytest.raises(BadRequestError) as raised:
        client.authorize("not-a-uuid", "calendar.create", {})
    assert (raised.value.status_code, raised.value.code) == (400, "VALIDATION_ERROR")


def _until_refused(client: AuthzClient, agent_id: str, attempts: int) -> None:
    for _ in range(attempts):
        client.authorize(agent_id, "calendar.create", {})


def test_the_rate_limit_raises_with_retry_after_ms(database_url, workspace, agent_id):
    key = workspace.key("read-only")
    env = {"AGENTAUTH_RATE_LIMIT_PER_MINUTE": "2"}
    # 2 a minute: within 5 calls one is refused, even if the calls straddle a new minute
    with (
        running_server(database_url, workers=1, threads=2, env=env) as base,
        AuthzClient(base, key) as client,
        pytest.raises(RateLimitError) as raised,
    ):
        _until_refused(client, agent_id, 5)
    error = raised.value
    assert (error.status_code, error.code) == (429, "RATE_LIMITED")
    assert error.retry_after_ms is not None
    assert 1_000 <= error.retry_after_ms <= 60_000
    assert error.retry_after_ms % 1000 == 0


@pytest.mark.parametrize(
    ("status", "body", "code"),
    [
        (500, b'{"error": {"code": "INTERNAL_ERROR", "message": "boom"}}', "INTERNAL_ERROR"),
        (503, b"<html>bad gateway</html>", "UNAVAILABLE"),
        (200, b"<html>not json</html>", "BAD_RESPONSE"),
        (200, b'{"allowed": "true", "outcome": "allowed", "reason": "x"}', "BAD_RESPONSE"),
        (200, b'{"allowed": 1, "outcome": "allowed", "reason": "x"}', "BAD_RESPONSE"),
        (200, b'{"allowed": true, "outcome": "denied", "reason": "x"}', "BAD_RESPONSE"),
        (
            200,
            b'{"allowed": true, "outcome": "allowed", "reason": "x", "latencyMs": "1"}',
            "BAD_RESPONSE",
        ),
        (200, b"[true]", "BAD_RESPONSE"),
        (200, b"[" * 100_000, "BAD_RESPONSE"),
        (200, b" " * 100_000 + b"{}", "BAD_RESPONSE"),
        (408, b"", "UNAVAILABLE"),
    ],
    ids=[
        "500",
        "503-html",
        "200-html",
        "allowed-string",
        "allowed-one",
        "disagreeing",
        "allowed-bad-field",
        "array",
        "nested-deep",
        "over-64-KiB",
        "408",
    ],
)
def test_unusable_answers_raise_service_unavailable(status, body, code):
    key = "svc_" + "b" * 32
    location = {"Location": "http://127.0.0.1:1/"}
    with (
        faulty_service(status, body, headers=location) as (base, _),
        AuthzClient(base, key) as client,
        pytest.raises(ServiceUnavailableError) as raised,
    ):
        client.authorize("agent", "tool", {})
    assert raised.value.code == code
    assert key not in str(raised.value)


def test_a_closed_port_and_a_time_out_raise_service_unavailable():
    closed_port = f"http://127.0.0.1:{free_port()}"
    with (
        AuthzClient(closed_port, "svc_" + "c" * 32) as client,
        pytest.raises(ServiceUnavailableError, match="cannot reach") as closed,
    ):
        client.authorize("agent", "tool", {})
    assert closed.value.status_code is None
    with faulty_service(hold=True) as (base, received):
        with (
            AuthzClient(base, "svc_" + "c" * 32, timeout=0.3) as client,
            pytest.raises(ServiceUnavailableError, match="in time"),
        ):
            client.authorize("agent", "tool", {})
        assert len(received) == 1  # the request did arrive: the answer was too late


@pytest.mark.parametrize("status", [302, 204, 404])
def test_answers_that_are_not_the_endpoints_raise_bad_request(status):
    headers = {"Location": "https://127.0.0.1:1/v1/authorize"}
    with (
        faulty_service(status, b"", headers=headers) as (base, _),
        AuthzClient(base, "svc_" + "a" * 32) as client,
        pytest.raises(BadRequestError) as raised,
    ):
        client.authorize("agent", "tool", {})
    assert raised.value.status_code == status


def test_a_denial_counts_whatever_else_is_wrong_with_its_body():
    answer = b'{"allowed": false, "ruleIndex": "first", "reason": 7}'
    with faulty_service(200, answer) as (base, _), AuthzClient(base, "svc_" + "a" * 32) as client:
        decision = client.authorize("agent", "tool", {})
    assert (decision.allowed, decision.outcome, decision.rule_index) == (False, "denied", None)


@pytest.mark.parametrize(
    "key", [" svc_" + "1" * 32, "svc_" + "1" * 32 + "\n", "svc_ü" + "1" * 31, ""]
)
def test_bad_keys_are_refused_at_once_without_echoing_them(key):
    with pytest.raises(ValueError, match="api_key") as raised:
        AuthzClient("http://127.0.0.1:8080", key)
    assert "1" * 31 not in str(raised.value)
    assert raised.value.__context__ is None


def test_bad_arguments_are_refused_at_once():
    with pytest.raises(ValueError, match="base_url"):
        AuthzClient("127.0.0.1:8080", "svc_x")
    client = AuthzClient("http://127.0.0.1:1", "svc_" + "d" * 32)
    with client, pytest.raises(TypeError, match="parameters"):
        client.authorize("agent", "tool", ["not", "a", "mapping"])  # type: ignore[arg-type]


def test_a_custom_transport_is_used():
    """What users plug in for proxies or retries is honoured: every request goes through it
    (to a real socket)."""

    class Counting(httpx.HTTPTransport):
        sent = 0

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            Counting.sent += 1
            return super().handle_request(request)

    answer = json.dumps({"allowed": True, "outcome": "allowed", "reason": "ok"}).encode()
    with (
        faulty_service(200, answer) as (base, received),
        AuthzClient(base, "svc_" + "e" * 32, transport=Counting()) as client,
    ):
        assert client.authorize("agent", "tool").allowed is True
    assert Counting.sent == len(received) == 1


def test_a_session_reaches_the_audit_log_per_call_or_per_guard(
    service, api_key, agent_id, client, admin_headers
):
    """``session_id`` on a call, else the guard's: what the audit entry names."""
    authz = AuthzClient(service, api_key)
    assert authz.authorize(agent_id, "echo", {}, session_id="chat 42").session_id == "chat 42"
    guard = Guard(authz, agent_id, session_id="run-1")
    assert guard.check("echo", {}).session_id == "run-1"
    assert guard.check("echo", {}, session_id="run-2").session_id == "run-2"
    assert Guard(authz, agent_id).check("echo", {}).session_id is None
    entries = client.get(
        "/v1/audit-logs", query_string={"agent_id": agent_id}, headers=admin_headers
    ).json["data"]
    assert [e["sessionId"] for e in reversed(entries)] == ["chat 42", "run-1", "run-2", None]


@pytest.mark.parametrize("session_id", ["", "x" * 256, "line\nbreak", "caf\u00e9"])
def test_a_session_id_the_service_would_refuse_is_refused_before_sending(session_id):
    with faulty_service(200, b"{}") as (base, received):
        authz = AuthzClient(base, "svc_" + "c" * 32)
        with pytest.raises(ValueError, match="session_id must be 1 to 255 printable ASCII"):
            authz.authorize("agent", "echo", {}, session_id=session_id)
        with pytest.raises(ValueError, match="session_id"):
            Guard(authz, "agent", session_id=session_id)
        decision = Guard(authz, "agent").check("echo", {}, session_id=session_id)
    assert decision.allowed is False
    assert received == []
