"""The guard against a real server, and against misbehaving ones on real sockets: the handler
runs only on an allow, and what each failure means with on_error "deny" and "allow"."""

from __future__ import annotations

import json

import pytest

from agentauth import AsyncAuthzClient, AuthzClient, Guard, denied_result
from tests.agentauth.faults import faulty_service
from tests.server import free_port

KEY = "svc_" + "f" * 32


class Calls:
    """Records the calls that reached a handler."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict]] = []

    def __call__(self, name: str, **arguments: object) -> str:
        self.seen.append((name, arguments))
        return f"{name} ran"


def test_the_decorator_runs_allowed_calls_and_stops_denied_ones(service, api_key, agent_id):
    calls = Calls()
    guard = Guard(AuthzClient(service, api_key), agent_id)

    @guard.tool("payments.refund")
    def refund(amount: float, currency: str = "EUR") -> str:
        return calls("refund", amount=amount, currency=currency)

    @guard.tool()
    def echo(text: str) -> str:  # the tool name is the function's: "echo"
        return calls("echo", text=text)

    @guard.tool
    def wipe_disk() -> str:  # no policy allows "wipe_disk"
        return calls("wipe_disk")

    assert refund(40) == "refund ran"  # the default currency is part of the check
    assert echo("hi") == "echo ran"
    over = refund(400)
    wrong_currency = refund(40, currency="GBP")
    wiped = wipe_disk()
    assert calls.seen == [("refund", {"amount": 40, "currency": "EUR"}), ("echo", {"text": "hi"})]
    for result in (over, wrong_currency, wiped):
        assert result["isError"] is True
        assert result["content"][0]["type"] == "text"
        assert result["content"][0]["text"].startswith("Authorization denied: ")
    assert "default deny" in wiped["content"][0]["text"]
    assert refund.__name__ == "refund"  # functools.wraps: the handler still looks like itself


def test_check_answers_with_the_services_decision(service, api_key, agent_id):
    guard = Guard(AuthzClient(service, api_key), agent_id)
    decision = guard.check("calendar.delete_all", {})
    assert decision.allowed is False
    assert decision.rule_index == 0
    assert (
        denied_result(decision.reason)["content"][0]["text"]
        == f"Authorization denied: {decision.reason}"
    )


@pytest.mark.anyio
@pytest.mark.parametrize(
    "client_kind", [AsyncAuthzClient, AuthzClient], ids=["async-client", "sync-client"]
)
async def test_async_handlers_are_guarded_with_either_client(
    service, api_key, agent_id, client_kind
):
    calls = Calls()
    guard = Guard(client_kind(service, api_key), agent_id)

    @guard.tool("calendar.create")
    async def create(title: str) -> str:
        return calls("create", title=title)

    @guard.tool("calendar.delete_all")
    async def delete_all() -> str:
        return calls("delete_all")

    assert await create("standup") == "create ran"
    denied = await delete_all()
    assert denied["isError"] is True
    assert calls.seen == [("create", {"title": "standup"})]


def test_methods_are_guarded_without_self_in_the_parameters():
    answer = json.dumps({"allowed": True, "outcome": "allowed", "reason": "ok"}).encode()
    with faulty_service(200, answer) as (base, received):
        guard = Guard(AuthzClient(base, KEY), "agent")

        class Mailer:
            @guard.tool("email.send")
            def send(self, to: str, *attachments: str, **headers: str) -> str:
                return f"sent to {to}"

        assert Mailer().send("a@example.com", "x.pdf", priority="high") == "sent to a@example.com"
    assert json.loads(received[0])["parameters"] == {
        "to": "a@example.com",
        "attachments": ["x.pdf"],
        "priority": "high",
    }


FAULTS = {
    # name: (status, body, headers, hold)
    "500": (500, b'{"error": {"code": "INTERNAL_ERROR", "message": "boom"}}', {}, False),
    "garbage": (200, b"\x00\xffnot json at all", {}, False),
    "time-out": (200, b"", {}, True),
    "401": (401, b'{"error": {"code": "UNAUTHORIZED", "message": "invalid API key"}}', {}, False),
    "403": (403, b'{"error": {"code": "INSUFFICIENT_SCOPE", "message": "no"}}', {}, False),
    "400": (400, b'{"error": {"code": "VALIDATION_ERROR", "message": "bad"}}', {}, False),
    "429": (
        429,
        b'{"error": {"code": "RATE_LIMITED", "message": "slow down"}}',
        {"Retry-After": "7"},
        False,
    ),
}
UNREACHABLE = {"closed-port", "500", "garbage", "time-out"}


def _guarded_call(base: str, on_error: str) -> tuple[object, Calls]:
    calls = Calls()
    guard = Guard(AuthzClient(base, KEY, timeout=0.3), "agent", on_error=on_error)  # type: ignore[arg-type]

    @guard.tool("calendar.create")
    def create(title: str) -> str:
        return calls("create", title=title)

    return create("standup"), calls


@pytest.mark.parametrize("on_error", ["deny", "allow"])
@pytest.mark.parametrize("fault", ["closed-port", *FAULTS])
def test_failures_deny_unless_unreachable_and_on_error_allows(fault, on_error):
    if fault == "closed-port":
        result, calls = _guarded_call(f"http://127.0.0.1:{free_port()}", on_error)
    else:
        status, body, headers, hold = FAULTS[fault]
        with faulty_service(status, body, headers=headers, hold=hold) as (base, _):
            result, calls = _guarded_call(base, on_error)
    runs = fault in UNREACHABLE and on_error == "allow"
    assert (calls.seen != []) is runs
    if runs:
        assert result == "create ran"
        return
    assert isinstance(result, dict)
    assert result["isError"] is True
    text = result["content"][0]["text"]
    assert text.startswith("Authorization denied: ")
    assert KEY not in text
    if fault in UNREACHABLE:
        assert "authorization service unreachable" in text
    elif fault == "429":
        assert "retry in 7 s" in text
    else:
        assert FAULTS[fault][1].decode().split('"code": "')[1].split('"')[0] in text


def test_on_error_allow_still_reports_why(service, agent_id):
    guard = Guard(AuthzClient(f"http://127.0.0.1:{free_port()}", KEY), agent_id, on_error="allow")
    decision = guard.check("calendar.create", {})
    assert decision.allowed is True
    assert decision.error is not None
    assert decision.error.code == "UNAVAILABLE"
    assert "allowed because on_error is 'allow'" in decision.reason


def test_parameters_without_a_json_form_deny_whatever_on_error_says():
    calls = Calls()
    guard = Guard(AuthzClient(f"http://127.0.0.1:{free_port()}", KEY), "agent", on_error="allow")

    @guard.tool("files.write")
    def write(handle: object) -> str:
        return calls("write")

    result = write(object())
    assert calls.seen == []
    assert "cannot be sent for authorization" in result["content"][0]["text"]


def test_misuse_is_refused_when_the_guard_is_made():
    with pytest.raises(ValueError, match="on_error"):
        Guard(AuthzClient("http://127.0.0.1:1", KEY), "agent", on_error="open")  # type: ignore[arg-type]
    guard = Guard(AsyncAuthzClient("http://127.0.0.1:1", KEY), "agent")
    with pytest.raises(TypeError, match="sync handler"):

        @guard.tool()
        def blocking() -> None:
            return None

    with pytest.raises(TypeError, match="check_async"):
        guard.check("tool", {})
    assert KEY not in repr(guard)
