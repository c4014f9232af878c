"""The guard against a real server, and against misbehaving ones on real sockets: the handler
runs only on an allow, and what each failure means with on_error "deny" and "allow"."""

from __future__ import annotations

import json
import logging
import math
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import anyio
import pytest

from agentauth import AsyncAuthzClient, AuthzClient, Guard, PolicyWarning, denied_result
from tests.agentauth.cases import each_case, judge, judge_warnings, stand_in
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


def _guarded_call(
    base: str, on_error: str, asynchronous: bool, timeout: float
) -> tuple[object, Calls]:
    calls = Calls()
    kind = AsyncAuthzClient if asynchronous else AuthzClient
    guard = Guard(kind(base, KEY, timeout=timeout), "agent", on_error=on_error)  # type: ignore[arg-type]
    if not asynchronous:

        @guard.tool("calendar.create")
        def create(title: str) -> str:
            return calls("create", title=title)

        return create("standup"), calls

    @guard.tool("calendar.create")
    async def create_async(title: str) -> str:
        return calls("create", title=title)

    return anyio.run(create_async, "standup"), calls


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@each_case()
def test_every_case_of_the_shared_table(case, on_error, asynchronous, caplog):
    """conformance/guard-cases.yaml, through a decorated handler, sync and async."""
    caplog.set_level(logging.WARNING, logger="agentauth")
    with stand_in(case) as base:
        result, calls = _guarded_call(base, on_error, asynchronous, case.timeout)
    judge_warnings(case, caplog.records)
    ran = calls.seen != []
    if ran:
        assert result == "create ran"
    denial = None
    if not ran:
        assert isinstance(result, dict)
        assert result["isError"] is True
        denial = result["content"][0]["text"]
    judge(case, on_error, ran, denial, KEY)


def test_a_warn_policy_s_warning_is_kept_on_the_decision_and_logged_once(caplog):
    answer = {
        "allowed": True, "outcome": "allowed", "reason": "ok",
        "warnings": [{"policyId": "p-1", "result": "denied", "reason": "no refunds on Sundays"}],
    }  # fmt: skip
    with faulty_service(200, json.dumps(answer).encode()) as (base, _):
        guard = Guard(AuthzClient(base, KEY), "agent")
        with caplog.at_level(logging.WARNING, logger="agentauth"):
            decision = guard.check("payments.refund", {"amount": 5})
    assert decision.allowed is True  # the real decision is followed
    assert decision.warnings == (PolicyWarning("p-1", "denied", "no refunds on Sundays"),)
    assert [r.getMessage() for r in caplog.records if r.name == "agentauth"] == [
        "warn policy p-1 would have denied the call to payments.refund (the call was allowed): "
        "no refunds on Sundays"
    ]


def test_a_body_trickled_past_the_deadline_counts_as_unreachable():
    body = json.dumps({"allowed": True, "outcome": "allowed", "reason": "x" * 400}).encode()
    with faulty_service(200, body, trickle=True) as (base, _):
        guard = Guard(AuthzClient(base, KEY, timeout=0.5), "agent")
        decision = guard.check("calendar.create", {})
    assert decision.allowed is False
    assert "authorization service unreachable" in decision.reason


@pytest.mark.parametrize("asynchronous", [False, True], ids=["AuthzClient", "AsyncAuthzClient"])
def test_a_refusal_whose_body_trickles_past_the_deadline_still_denies(asynchronous):
    """The status came in time, the body did not: a 401 is a refused key, never an outage that
    on_error="allow" would let through (both clients alike)."""
    body = json.dumps({"error": {"code": "UNAUTHORIZED", "message": "x" * 400}}).encode()
    with faulty_service(401, body, trickle=True) as (base, _):
        if asynchronous:
            guard = Guard(AsyncAuthzClient(base, KEY, timeout=0.5), "agent", on_error="allow")
            decision = anyio.run(guard.check_async, "calendar.create", {})
        else:
            guard = Guard(AuthzClient(base, KEY, timeout=0.5), "agent", on_error="allow")
            decision = guard.check("calendar.create", {})
    assert decision.allowed is False
    assert decision.error is not None
    assert decision.error.status_code == 401


def test_retry_after_as_an_http_date_gives_the_wait():
    """The wait is the time from when the answer was read to the date, in whole seconds
    rounded up: bounded by the clock read before the call and after it, however long the call
    took (no assumption about the machine's speed)."""
    before = datetime.now(UTC)
    when = (before + timedelta(seconds=90)).replace(microsecond=0)  # an HTTP date has seconds
    headers = {"Retry-After": format_datetime(when, usegmt=True)}
    with faulty_service(429, b"{}", headers=headers) as (base, _):
        decision = Guard(AuthzClient(base, KEY), "agent").check("calendar.create", {})
    after = datetime.now(UTC)
    assert decision.allowed is False
    assert decision.retry_after_seconds is not None
    longest = math.ceil((when - before).total_seconds())  # 90: the date's, not a default
    shortest = max(0, math.ceil((when - after).total_seconds()))
    assert shortest <= decision.retry_after_seconds <= longest


def test_a_kwargs_name_repeating_a_parameter_is_denied_without_asking():
    calls = Calls()
    answer = json.dumps({"allowed": True, "outcome": "allowed", "reason": "ok"}).encode()
    with faulty_service(200, answer) as (base, received):
        guard = Guard(AuthzClient(base, KEY), "agent")

        @guard.tool("payments.refund")
        def refund(amount: int, /, **extra: object) -> str:
            return calls("refund", amount=amount)

        result = refund(1000, amount=5)
    assert calls.seen == []
    assert received == []
    assert "cannot be checked" in result["content"][0]["text"]


def test_cls_of_a_plain_function_is_a_parameter_like_any_other():
    answer = json.dumps({"allowed": True, "outcome": "allowed", "reason": "ok"}).encode()
    with faulty_service(200, answer) as (base, received):
        guard = Guard(AuthzClient(base, KEY), "agent")

        @guard.tool("classify")
        def classify(cls: str, amount: int) -> str:
            return cls

        classify("gold", 5)
    assert json.loads(received[0])["parameters"] == {"cls": "gold", "amount": 5}


def test_the_decision_keeps_no_exception_chain_nor_frames():
    guard = Guard(AuthzClient(f"http://127.0.0.1:{free_port()}", KEY), "agent", on_error="allow")
    decision = guard.check("calendar.create", {})
    assert decision.error is not None
    assert decision.error.__context__ is None
    assert decision.error.__cause__ is None
    assert decision.error.__traceback__ is None


def test_a_number_past_pythons_digit_limit_is_denied_not_raised():
    guard = Guard(AuthzClient(f"http://127.0.0.1:{free_port()}", KEY), "agent", on_error="allow")
    decision = guard.check("calendar.create", {"n": 10**5000})
    assert decision.allowed is False
    assert "INVALID_PARAMETERS" in decision.reason


def test_on_error_allow_still_reports_why():
    guard = Guard(AuthzClient(f"http://127.0.0.1:{free_port()}", KEY), "agent", on_error="allow")
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
    assert "cannot be checked (INVALID_PARAMETERS)" in result["content"][0]["text"]


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
    with pytest.raises(TypeError, match="generator"):

        @guard.tool()
        async def stream():  # type: ignore[no-untyped-def]
            yield 1

    with pytest.raises(TypeError, match="below @staticmethod"):
        guard.tool("x")(staticmethod(lambda: None))  # type: ignore[arg-type]
