"""Escalated calls (decisions §6) through the SDK: against a real server, the escalated denial
names the approval, and a guard that waits runs the handler once after an approver approves,
never after a denial or when the wait runs out. With httpx mock transports: how escalated
decisions and approvals are read, and how the wait polls (on a fake clock)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import anyio
import httpx
import pytest
from mcp.server.fastmcp import FastMCP

import agentauth.guard as guard_module
from agentauth import (
    Approval,
    AsyncAuthzClient,
    AuthzClient,
    AuthzError,
    BadRequestError,
    Guard,
    ServiceUnavailableError,
    UnauthorizedError,
)
from tests.agentauth.test_mcp import call

KEY = "svc_" + "9" * 32
APPROVAL = "0b9f8d7e-1c2a-4b3c-9d8e-7f6a5b4c3d2e"
EXPIRES = "2026-11-21T13:00:00.000000Z"
ESCALATED = {
    "allowed": False,
    "outcome": "escalated",
    "reason": "approval required by policy 'p' rule 0 (require_approval): parameter 'amount' "
    "must be at most 1000",
    "policyId": "pol-1",
    "ruleIndex": 0,
    "auditId": "aud-1",
    "latencyMs": 1.5,
    "approvalId": APPROVAL,
    "approvalExpiresAt": EXPIRES,
}
#: the longest a guard here waits for an approval (the tests that approve or deny take about
#: 1.5 s: the approver decides right after the guard's first look)
WAIT = 10
#: how long the approver's side waits for the guard to look, and for its own request
SYNC_SECONDS = 20

# ------------------------------------------------------------------ against a real server

BIG = {"amount": 5000, "currency": "EUR"}


@pytest.fixture
def approver_key(workspace: Any) -> str:
    return workspace.key("approver")


class Refunds:
    """The handler: records each refund that ran."""

    def __init__(self) -> None:
        self.ran: list[dict[str, Any]] = []

    def __call__(self, amount: int, currency: str) -> str:
        self.ran.append({"amount": amount, "currency": currency})
        return f"refunded {amount} {currency}"


class Approver:
    """A human on another thread: once the guard has looked at an approval (the approval exists
    and the guard is waiting), decides it with an approver key. The signal is a transport hook
    on the guard's client, so nothing here sleeps."""

    def __init__(self, base: str, key: str, verb: str | None) -> None:
        self.base, self.key, self.verb = base, key, verb
        self.looked = threading.Event()
        self.looked_at: list[str] = []
        self.decided: list[dict[str, Any]] = []
        self.thread = threading.Thread(target=self._decide, daemon=True)

    def saw(self, request: httpx.Request) -> None:
        if request.method == "GET" and request.url.path.startswith("/v1/approvals/"):
            self.looked_at.append(request.url.path.rsplit("/", 1)[1])
            self.looked.set()

    def sync_transport(self) -> httpx.HTTPTransport:
        saw = self.saw

        class Watching(httpx.HTTPTransport):
            def handle_request(self, request: httpx.Request) -> httpx.Response:
                saw(request)
                return super().handle_request(request)

        return Watching()

    def async_transport(self) -> httpx.AsyncHTTPTransport:
        saw = self.saw

        class Watching(httpx.AsyncHTTPTransport):
            async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
                saw(request)
                return await super().handle_async_request(request)

        return Watching()

    def _decide(self) -> None:
        if self.verb is None or not self.looked.wait(SYNC_SECONDS) or not self.looked_at:
            return
        approval_id = self.looked_at[0]
        answer = httpx.post(
            f"{self.base}/v1/approvals/{approval_id}/{self.verb}",
            json={"comment": f"{self.verb} by the test"},
            headers={"Authorization": f"Bearer {self.key}"},
            timeout=SYNC_SECONDS,
        )
        self.decided.append({"status_code": answer.status_code, **answer.json()})

    def __enter__(self) -> Approver:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.looked.set()  # a guard that never looked must not keep the thread waiting
        self.thread.join(SYNC_SECONDS)


def _approval_status(base: str, key: str, approval_id: str) -> str:
    with AuthzClient(base, key) as client:
        return client.approval(approval_id).status


def test_an_escalated_call_is_denied_naming_the_approval(service, api_key, approval_agent):
    refunds = Refunds()
    with AuthzClient(service, api_key) as client:
        guard = Guard(client, approval_agent)
        refund = guard.tool("payments.refund")(refunds)
        result = refund(5000, "EUR")
        decision = client.authorize(approval_agent, "payments.refund", BIG)
        approval = client.approval(decision.approval_id or "")
        small = refund(50, "EUR")  # within the constraint: no human needed
    assert refunds.ran == [{"amount": 50, "currency": "EUR"}]
    assert small == "refunded 50 EUR"
    assert (decision.allowed, decision.outcome, decision.rule_index) == (False, "escalated", 0)
    assert decision.approval_id is not None
    assert decision.approval_expires_at is not None
    assert decision.approval_expires_at.tzinfo is not None
    assert decision.approval_expires_at.utcoffset() == UTC.utcoffset(None)
    assert (approval.id, approval.status, approval.pending) == (
        decision.approval_id,
        "pending",
        True,
    )
    assert (approval.tool_name, approval.agent_id) == ("payments.refund", approval_agent)
    assert approval.expires_at == decision.approval_expires_at
    assert result["isError"] is True
    text = result["content"][0]["text"]
    assert text.startswith("Authorization denied: approval required: approval ")
    # the identical call reused the pending approval: the guard's text names that one
    assert f"approval {decision.approval_id} is pending until " in text
    assert decision.approval_expires_at.strftime("%Y-%m-%dT%H:%M:%SZ") in text
    assert decision.reason in text
    assert "must be at most 1000" in text
    assert api_key not in text


def test_a_decision_that_needs_no_approval_says_so(service, api_key, approval_agent, agent_id):
    with AuthzClient(service, api_key) as client:
        allowed = client.authorize(approval_agent, "payments.refund", {"amount": 5})
        denied = client.authorize(agent_id, "calendar.delete_all", {})
    assert (allowed.outcome, allowed.approval_id, allowed.approval_expires_at) == (
        "allowed",
        None,
        None,
    )
    assert (denied.outcome, denied.approval_id, denied.approval_expires_at) == (
        "denied",
        None,
        None,
    )


def test_the_guard_waits_and_runs_the_handler_once_when_approved(
    service, api_key, approver_key, approval_agent
):
    refunds = Refunds()
    with (
        Approver(service, approver_key, "approve") as approver,
        AuthzClient(service, api_key, transport=approver.sync_transport()) as client,
    ):
        guard = Guard(client, approval_agent, wait_for_approval=WAIT)
        refund = guard.tool("payments.refund")(refunds)
        result = refund(5000, "EUR")
    assert result == "refunded 5000 EUR"
    assert refunds.ran == [{"amount": 5000, "currency": "EUR"}]
    [decided] = approver.decided
    assert (decided["status_code"], decided["status"]) == (200, "approved")
    # the approval was used by that call: the next identical one escalates anew
    assert _approval_status(service, api_key, decided["id"]) == "used"
    with AuthzClient(service, api_key) as client:
        again = Guard(client, approval_agent).check("payments.refund", BIG)
    assert again.outcome == "escalated"
    assert again.approval_id != decided["id"]


def test_an_allow_after_waiting_names_the_approval(service, api_key, approver_key, approval_agent):
    with (
        Approver(service, approver_key, "approve") as approver,
        AuthzClient(service, api_key, transport=approver.sync_transport()) as client,
    ):
        decision = Guard(client, approval_agent, wait_for_approval=WAIT).check(
            "payments.refund", BIG
        )
    assert (decision.allowed, decision.outcome) == (True, "allowed")
    assert decision.approval_id == approver.decided[0]["id"]
    assert decision.error is None


@pytest.mark.anyio
async def test_an_async_guard_waits_too(service, api_key, approver_key, approval_agent):
    refunds = Refunds()
    with Approver(service, approver_key, "approve") as approver:
        transport = approver.async_transport()
        async with AsyncAuthzClient(service, api_key, transport=transport) as client:
            guard = Guard(client, approval_agent, wait_for_approval=WAIT)

            @guard.tool("payments.refund")
            async def refund(amount: int, currency: str) -> str:
                return refunds(amount, currency)

            result = await refund(5000, "EUR")
    assert result == "refunded 5000 EUR"
    assert refunds.ran == [{"amount": 5000, "currency": "EUR"}]


async def _refund_async(guard: Guard, refunds: Refunds) -> Any:
    @guard.tool("payments.refund")
    async def refund(amount: int, currency: str) -> str:
        return refunds(amount, currency)

    result = await refund(5000, "EUR")
    assert isinstance(guard.client, AsyncAuthzClient)
    await guard.client.aclose()
    return result


@pytest.mark.parametrize("client_kind", ["async", "sync"])
def test_a_denial_while_waiting_never_runs_the_handler(
    service, api_key, approver_key, approval_agent, client_kind
):
    refunds = Refunds()
    with Approver(service, approver_key, "deny") as approver:
        if client_kind == "sync":
            with AuthzClient(service, api_key, transport=approver.sync_transport()) as client:
                guard = Guard(client, approval_agent, wait_for_approval=WAIT)
                result = guard.tool("payments.refund")(refunds)(5000, "EUR")
        else:
            transport = approver.async_transport()
            async_client = AsyncAuthzClient(service, api_key, transport=transport)
            guard = Guard(async_client, approval_agent, wait_for_approval=WAIT)
            result = anyio.run(_refund_async, guard, refunds)
    assert refunds.ran == []
    [decided] = approver.decided
    assert decided["status"] == "denied"
    text = result["content"][0]["text"]
    assert result["isError"] is True
    assert text.startswith("Authorization denied: denied by policy ")
    assert f"approval {decided['id']} was denied" in text
    # and so it stays for identical calls until the approval expires
    with AuthzClient(service, api_key) as client:
        later = client.authorize(approval_agent, "payments.refund", BIG)
    assert (later.outcome, later.approval_id) == ("denied", decided["id"])


def test_a_wait_that_runs_out_never_runs_the_handler(service, api_key, approval_agent):
    refunds = Refunds()
    with (
        Approver(service, "nobody", None) as watcher,  # no one decides: it only watches
        AuthzClient(service, api_key, transport=watcher.sync_transport()) as client,
    ):
        guard = Guard(client, approval_agent, wait_for_approval=1)
        result = guard.tool("payments.refund")(refunds)(5000, "EUR")
    assert refunds.ran == []
    assert watcher.looked_at  # it did poll the approval before giving up
    text = result["content"][0]["text"]
    assert text.startswith(
        f"Authorization denied: approval required: approval {watcher.looked_at[0]} is pending"
    )
    assert "not decided within the 1 s waited" in text
    assert _approval_status(service, api_key, watcher.looked_at[0]) == "pending"


@pytest.mark.anyio
async def test_mcp_protect_waits_for_the_approval(service, api_key, approver_key, approval_agent):
    ran: list[str] = []
    server = FastMCP("payments")

    @server.tool(name="payments.refund")
    def refund(amount: int, currency: str) -> str:
        ran.append("payments.refund")
        return f"refunded {amount} {currency}"

    with Approver(service, approver_key, "approve") as approver:
        transport = approver.async_transport()
        async with AsyncAuthzClient(service, api_key, transport=transport) as client:
            Guard(client, approval_agent, wait_for_approval=WAIT).protect(server)
            result = await call(server, "payments.refund", BIG)
    assert result.isError is False
    assert ran == ["payments.refund"]


@pytest.mark.anyio
async def test_mcp_protect_denies_an_escalated_call_naming_the_approval(
    service, api_key, approval_agent
):
    ran: list[str] = []
    server = FastMCP("payments")

    @server.tool(name="payments.refund")
    def refund(amount: int, currency: str) -> str:
        ran.append("payments.refund")
        return "refunded"

    async with AsyncAuthzClient(service, api_key) as client:
        Guard(client, approval_agent).protect(server)
        result = await call(server, "payments.refund", BIG)
        decision = await client.authorize(approval_agent, "payments.refund", BIG)
    assert ran == []
    assert result.isError is True
    [content] = result.content
    assert content.text.startswith(
        f"Authorization denied: approval required: approval {decision.approval_id} is pending"
    )
    assert decision.reason in content.text


def test_reading_an_unknown_approval_raises_not_found(service, api_key):
    with AuthzClient(service, api_key) as client, pytest.raises(BadRequestError) as raised:
        client.approval("00000000-0000-4000-8000-000000000000")
    assert (raised.value.status_code, raised.value.code) == (404, "APPROVAL_NOT_FOUND")


# ------------------------------------------------------------------ with mock transports


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.Response(status, content=json.dumps(body).encode(), headers=headers)


def _client(handler: Callable[[httpx.Request], httpx.Response]) -> AuthzClient:
    return AuthzClient("http://authz.test", KEY, transport=httpx.MockTransport(handler))


def _decide(body: Any) -> Any:
    with _client(lambda _: _json(200, body)) as client:
        return client.authorize("agent", "payments.refund", BIG)


def test_an_escalated_answer_is_read_whole():
    decision = _decide(ESCALATED)
    assert (decision.allowed, decision.outcome) == (False, "escalated")
    assert decision.reason == ESCALATED["reason"]
    assert (decision.policy_id, decision.rule_index, decision.audit_id) == ("pol-1", 0, "aud-1")
    assert decision.approval_id == APPROVAL
    assert decision.approval_expires_at == datetime(2026, 11, 21, 13, 0, tzinfo=UTC)
    assert decision.approval_expires_at.tzinfo is not None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2026-11-21T14:00:00+01:00", datetime(2026, 11, 21, 13, 0, tzinfo=UTC)),
        ("2026-11-21T13:00:00", datetime(2026, 11, 21, 13, 0, tzinfo=UTC)),
        ("2026-11-21t13:00:00z", datetime(2026, 11, 21, 13, 0, tzinfo=UTC)),
        ("next tuesday", None),
        ("2026-13-45T99:00:00Z", None),
        ("", None),
        ("2" * 100, None),
        (1_790_000_000, None),
        (None, None),
    ],
    ids=["offset", "naive", "lower-case", "words", "impossible", "empty", "long", "number", "null"],
)
def test_approval_expires_at_is_utc_or_ignored_on_a_denial(value, expected):
    decision = _decide({**ESCALATED, "approvalExpiresAt": value})
    assert decision.outcome == "escalated"
    assert decision.approval_id == APPROVAL
    assert decision.approval_expires_at == expected
    if expected is not None:
        assert decision.approval_expires_at.utcoffset() == UTC.utcoffset(None)


@pytest.mark.parametrize("value", [7, "", "../../v1/api-keys", "a b", "x" * 129])
def test_a_malformed_approval_id_on_a_denial_is_ignored(value):
    decision = _decide({**ESCALATED, "approvalId": value})
    assert (decision.allowed, decision.outcome, decision.approval_id) == (False, "escalated", None)


def test_outcomes_other_than_escalated_deny_as_before():
    for outcome in ("denied", "allowed", None, 3, "ESCALATED"):
        decision = _decide({**ESCALATED, "outcome": outcome})
        assert (decision.allowed, decision.outcome) == (False, "denied")
    bare = _decide({"allowed": False, "outcome": "escalated"})
    assert (bare.outcome, bare.reason, bare.approval_id) == ("escalated", "approval required", None)


def test_an_allow_names_the_approval_it_used_and_must_be_well_formed():
    allow = {"allowed": True, "outcome": "allowed", "reason": "ok", "approvalId": APPROVAL}
    decision = _decide({**allow, "approvalExpiresAt": None})
    assert (decision.allowed, decision.approval_id, decision.approval_expires_at) == (
        True,
        APPROVAL,
        None,
    )
    for bad in ({"approvalExpiresAt": "soon"}, {"approvalId": 7}, {"approvalId": "../x"}):
        with pytest.raises(ServiceUnavailableError) as raised:
            _decide({**allow, **bad})
        assert raised.value.code == "BAD_RESPONSE"
    with pytest.raises(ServiceUnavailableError):  # allowed: true needs outcome 'allowed'
        _decide({**ESCALATED, "allowed": True})


APPROVAL_BODY = {
    "id": APPROVAL,
    "agentId": "agent",
    "toolName": "payments.refund",
    "parameters": {"amount": 5000},
    "status": "approved",
    "createdAt": "2026-11-21T12:00:00.000000Z",
    "expiresAt": EXPIRES,
    "decidedAt": "2026-11-21T12:05:00.000000Z",
    "decidedBy": {"keyId": "k", "name": "ops"},
    "comment": "fine",
}


def test_an_approval_is_read_with_a_get_of_its_path():
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return _json(200, APPROVAL_BODY)

    with _client(answer) as client:
        approval = client.approval(APPROVAL)
    assert approval == Approval(
        id=APPROVAL,
        status="approved",
        agent_id="agent",
        tool_name="payments.refund",
        expires_at=datetime(2026, 11, 21, 13, 0, tzinfo=UTC),
        decided_at=datetime(2026, 11, 21, 12, 5, tzinfo=UTC),
        comment="fine",
    )
    assert approval.pending is False
    [request] = seen
    assert (request.method, request.url.path, request.content) == (
        "GET",
        f"/v1/approvals/{APPROVAL}",
        b"",
    )
    assert request.headers["Authorization"] == f"Bearer {KEY}"


def test_an_approvals_loose_fields_are_ignored_when_malformed():
    body = {"status": "pending", "expiresAt": "later", "toolName": 5, "comment": "c" * 5000}
    with _client(lambda _: _json(200, body)) as client:
        approval = client.approval(APPROVAL)
    assert (approval.id, approval.status, approval.expires_at, approval.tool_name) == (
        APPROVAL,
        "pending",
        None,
        None,
    )
    assert approval.comment is not None
    assert len(approval.comment) <= 1001


def _approval_error(response: httpx.Response) -> AuthzError:
    with _client(lambda _: response) as client, pytest.raises(AuthzError) as raised:
        client.approval(APPROVAL)
    assert KEY not in str(raised.value)
    assert KEY not in repr(raised.value)
    return raised.value


def test_approval_answers_that_are_errors():
    not_found = _approval_error(
        _json(404, {"error": {"code": "APPROVAL_NOT_FOUND", "message": "no such approval"}})
    )
    assert isinstance(not_found, BadRequestError)
    assert (not_found.status_code, not_found.code) == (404, "APPROVAL_NOT_FOUND")
    failed = _approval_error(_json(503, {"error": {"code": "UNAVAILABLE", "message": "down"}}))
    assert isinstance(failed, ServiceUnavailableError)
    assert failed.status_code == 503
    unauthorized = _approval_error(_json(401, {"error": {"code": "UNAUTHORIZED", "message": "x"}}))
    assert isinstance(unauthorized, UnauthorizedError)
    redirect = _approval_error(httpx.Response(302, headers={"Location": "http://evil.test/"}))
    assert isinstance(redirect, BadRequestError)
    assert redirect.code == "UNEXPECTED_STATUS"
    assert "approvals endpoint" in redirect.message


@pytest.mark.parametrize(
    "body",
    [
        json.dumps({**APPROVAL_BODY, "comment": "x" * 70_000}).encode(),
        b"<html>not json</html>",
        b"[1]",
        json.dumps({**APPROVAL_BODY, "status": None}).encode(),
        json.dumps({**APPROVAL_BODY, "status": "Approved!"}).encode(),
    ],
    ids=["over-64-KiB", "html", "array", "no-status", "odd-status"],
)
def test_unusable_approval_answers_raise_service_unavailable(body):
    error = _approval_error(httpx.Response(200, content=body))
    assert isinstance(error, ServiceUnavailableError)
    assert error.code == "BAD_RESPONSE"


def test_a_network_error_reading_an_approval_raises_service_unavailable():
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError(f"refused {request.headers['Authorization']}", request=request)

    with _client(refuse) as client, pytest.raises(ServiceUnavailableError) as raised:
        client.approval(APPROVAL)
    assert raised.value.code == "UNAVAILABLE"
    assert KEY not in str(raised.value)
    assert raised.value.__context__ is None


@pytest.mark.parametrize("approval_id", ["", "../api-keys", "a/b", "a b", "x" * 200, "é"])
def test_an_approval_id_that_cannot_be_one_is_refused_before_sending(approval_id):
    seen: list[httpx.Request] = []
    with _client(lambda r: seen.append(r) or _json(200, APPROVAL_BODY)) as client:
        with pytest.raises(ValueError, match="approval_id"):
            client.approval(approval_id)
        with pytest.raises(TypeError, match="approval_id"):
            client.approval(None)  # type: ignore[arg-type]
    assert seen == []


@pytest.mark.anyio
async def test_the_async_client_reads_approvals_the_same():
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("missing"):
            return _json(404, {"error": {"code": "APPROVAL_NOT_FOUND", "message": "no"}})
        return _json(200, APPROVAL_BODY)

    transport = httpx.MockTransport(answer)
    async with AsyncAuthzClient("http://authz.test", KEY, transport=transport) as client:
        approval = await client.approval(APPROVAL)
        with pytest.raises(BadRequestError) as raised:
            await client.approval("missing")
    assert approval.status == "approved"
    assert raised.value.code == "APPROVAL_NOT_FOUND"


# ------------------------------------------------------------------ the wait, on a fake clock


class FakeTime:
    """The guard's clock and sleeps: sleeping moves the clock on, and is recorded."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    async def async_sleep(self, seconds: float) -> None:
        self.sleep(seconds)


@pytest.fixture
def fake_time(monkeypatch: pytest.MonkeyPatch) -> FakeTime:
    fake = FakeTime()
    monkeypatch.setattr(guard_module, "_clock", fake.clock)
    monkeypatch.setattr(guard_module, "_sleep", fake.sleep)
    monkeypatch.setattr(guard_module, "_async_sleep", fake.async_sleep)
    return fake


class Service:
    """A scripted service: authorize answers ``decisions`` in turn, approval reads ``looks`` in
    turn (the last of each repeats). Each is a decision (answered 200), a response, or an
    exception to raise."""

    def __init__(self, decisions: list[Any], looks: list[Any]) -> None:
        self.decisions, self.looks = decisions, looks
        self.asked = 0
        self.looked = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            self.asked += 1
            return self._answer(self.decisions[min(self.asked, len(self.decisions)) - 1])
        self.looked += 1
        return self._answer(self.looks[min(self.looked, len(self.looks)) - 1])

    @staticmethod
    def _answer(scripted: Any) -> httpx.Response:
        if isinstance(scripted, Exception):
            raise scripted
        if isinstance(scripted, httpx.Response):  # a fresh copy: each request reads its own
            return httpx.Response(
                scripted.status_code, headers=scripted.headers, content=scripted.content
            )
        return _json(200, scripted)


def _pending() -> httpx.Response:
    return _json(200, {**APPROVAL_BODY, "status": "pending"})


ALLOWED = {"allowed": True, "outcome": "allowed", "reason": "ok", "approvalId": APPROVAL}


def _guarded(service: Service, wait: float, on_error: str = "deny") -> Guard:
    return Guard(_client(service), "agent", wait_for_approval=wait, on_error=on_error)  # type: ignore[arg-type]


def test_the_wait_backs_off_and_stops_at_the_deadline(fake_time):
    service = Service([ESCALATED], [_pending()])
    decision = _guarded(service, 12).check("payments.refund", BIG)
    assert fake_time.sleeps == [0.5, 1.0, 2.0, 4.0, 4.5]  # doubling, cut at the 12 s
    assert service.looked == 5
    assert service.asked == 1  # still pending: never asked again
    assert (decision.allowed, decision.outcome, decision.approval_id) == (
        False,
        "escalated",
        APPROVAL,
    )
    assert decision.reason == (
        f"approval required: approval {APPROVAL} is pending until 2026-11-21T13:00:00Z; "
        f"not decided within the 12 s waited; {ESCALATED['reason']}"
    )


def test_the_pause_between_looks_is_at_most_five_seconds(fake_time):
    service = Service([ESCALATED], [_pending()])
    _guarded(service, 30).check("payments.refund", BIG)
    assert fake_time.sleeps == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0, 5.0, 2.5]


def test_once_decided_the_service_is_asked_again(fake_time):
    approved = _json(200, {**APPROVAL_BODY, "status": "approved"})
    service = Service([ESCALATED, ALLOWED], [_pending(), approved])
    decision = _guarded(service, 60).check("payments.refund", BIG)
    assert (decision.allowed, decision.approval_id, decision.reason) == (True, APPROVAL, "ok")
    assert (service.asked, service.looked) == (2, 2)
    assert fake_time.sleeps == [0.5, 1.0]


def test_network_errors_while_polling_do_not_end_the_wait(fake_time):
    refused = httpx.ConnectError("refused")
    looks = [refused, _json(503, {}), httpx.Response(200, content=b"junk"), _json(429, {})]
    approved = _json(200, {**APPROVAL_BODY, "status": "approved"})
    service = Service([ESCALATED, ALLOWED], [*looks, approved])
    decision = _guarded(service, 60).check("payments.refund", BIG)
    assert decision.allowed is True
    assert (service.asked, service.looked) == (2, 5)


def test_on_error_applies_to_the_authorize_calls_only(fake_time):
    """Polling failures never allow; asking again after the decision is an authorize call, and
    there an unreachable service means what on_error says."""
    service = Service([ESCALATED], [httpx.ConnectError("refused")])
    decision = _guarded(service, 3, on_error="allow").check("payments.refund", BIG)
    assert (decision.allowed, decision.outcome) == (False, "escalated")
    assert service.looked > 1  # it kept looking until the wait was over
    # decided, then the service fails when asked again
    then_failing = [ESCALATED, _json(500, {"error": {"code": "INTERNAL_ERROR", "message": "x"}})]
    denied_look = [_json(200, {**APPROVAL_BODY, "status": "denied"})]
    allowed = _guarded(Service(then_failing, denied_look), 3, on_error="allow").check(
        "payments.refund", BIG
    )
    denied = _guarded(Service(then_failing, denied_look), 3).check("payments.refund", BIG)
    assert allowed.allowed is True
    assert "allowed because on_error is 'allow'" in allowed.reason
    assert (denied.allowed, denied.outcome) == (False, "denied")
    assert "unreachable" in denied.reason


def test_an_approval_gone_asks_again_and_a_refused_read_stops(fake_time):
    gone = _json(404, {"error": {"code": "APPROVAL_NOT_FOUND", "message": "no"}})
    unknown = {"allowed": False, "outcome": "denied", "reason": "unknown agent"}
    service = Service([ESCALATED, unknown], [gone])
    decision = _guarded(service, 60).check("payments.refund", BIG)
    assert (decision.outcome, decision.reason, service.asked) == ("denied", "unknown agent", 2)

    forbidden = _json(403, {"error": {"code": "INSUFFICIENT_SCOPE", "message": "no reading"}})
    service = Service([ESCALATED], [forbidden])
    decision = _guarded(service, 60).check("payments.refund", BIG)
    assert (decision.outcome, service.asked, service.looked) == ("escalated", 1, 1)
    assert "the approval cannot be read (INSUFFICIENT_SCOPE): no reading" in decision.reason


def test_a_new_escalation_after_the_approval_expired_is_waited_for(fake_time):
    other = "1c2d3e4f-0000-4000-8000-000000000000"
    expired = _json(200, {**APPROVAL_BODY, "status": "expired"})
    approved = _json(200, {**APPROVAL_BODY, "id": other, "status": "approved"})
    service = Service([ESCALATED, {**ESCALATED, "approvalId": other}, ALLOWED], [expired, approved])
    decision = _guarded(service, 60).check("payments.refund", BIG)
    assert decision.allowed is True
    assert (service.asked, service.looked) == (3, 2)


def test_without_wait_for_approval_nothing_is_polled(fake_time):
    service = Service([ESCALATED], [_pending()])
    guard = Guard(_client(service), "agent")
    decision = guard.check("payments.refund", BIG)
    assert (service.asked, service.looked, fake_time.sleeps) == (1, 0, [])
    assert decision.reason.startswith(f"approval required: approval {APPROVAL} is pending until ")
    assert "waited" not in decision.reason
    result = guard.tool("payments.refund")(Refunds())(5000, "EUR")
    assert result["content"][0]["text"] == "Authorization denied: " + decision.reason


@pytest.mark.anyio
async def test_the_async_wait_polls_the_same(fake_time):
    approved = _json(200, {**APPROVAL_BODY, "status": "approved"})
    service = Service([ESCALATED, ALLOWED], [_pending(), _pending(), approved])
    transport = httpx.MockTransport(service)
    client = AsyncAuthzClient("http://authz.test", KEY, transport=transport)
    async with client:
        guard = Guard(client, "agent", wait_for_approval=60)
        decision = await guard.check_async("payments.refund", BIG)
    assert decision.allowed is True
    assert (service.asked, service.looked) == (2, 3)
    assert fake_time.sleeps == [0.5, 1.0, 2.0]
    pending = Service([ESCALATED], [_pending()])
    transport = httpx.MockTransport(pending)
    async with AsyncAuthzClient("http://authz.test", KEY, transport=transport) as client:
        timed_out = await Guard(client, "agent", wait_for_approval=1).check_async(
            "payments.refund", BIG
        )
    assert (timed_out.outcome, pending.asked) == ("escalated", 1)
    assert "not decided within the 1 s waited" in timed_out.reason


@pytest.mark.parametrize("wait", [0, -1, float("inf"), float("nan"), True, "5", [5]], ids=repr)
def test_wait_for_approval_must_be_a_positive_finite_number(wait):
    with pytest.raises(ValueError, match="wait_for_approval"):
        Guard(AuthzClient("http://127.0.0.1:1", KEY), "agent", wait_for_approval=wait)


def test_the_guard_shows_its_wait_and_never_the_key():
    guard = Guard(AuthzClient("http://127.0.0.1:1", KEY), "agent", wait_for_approval=2)
    assert guard.wait_for_approval == 2.0
    assert "wait_for_approval=2.0" in repr(guard)
    assert KEY not in repr(guard)
