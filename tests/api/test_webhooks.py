"""Webhooks (decisions §6): creating, listing and deleting them (admin only, per workspace);
URLs refused as non-public at creation and again at each delivery; and delivery to a real
receiver on 127.0.0.1: signed, once when answered 2xx, retried with a doubling wait on a
failure, never redirected, given up 24 hours after the event, each event once however many
workers share the outbox, a crashed worker's lease expiring; and a real ``agentauth serve``
killed with SIGKILL delivering after its restart what was pending.

Deliveries run synchronously (``api.outbox.deliver_due``) against the test's database and fake
clock, limited to the test's workspace (the run shares one database). Each test's webhooks are
deleted when it ends, so no server a later test starts finds a delivery of ours to make.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY
from sqlalchemy import select

from api import create_app
from api.outbox import LEASE, deliver_due
from core.config import Settings
from core.domain.clock import utc_now
from core.domain.errors import ConfigError
from core.domain.webhooks import forbidden_reason, retry_delay
from core.hotpath.approvals import enqueue
from core.store.database import Database
from core.store.migrate import open_database
from core.store.models import Webhook
from core.store.webhooks import find_due, lease
from tests.api.helpers import assert_error, decide, instant, make_agent
from tests.conftest import PG_ENV, FakeClock, Tenant, postgresql_schema
from tests.server import server_process, session_members

ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 30  # seconds: a hang guard for waits on threads and sockets, never a measure
#: a try may hold its delivery for LEASE (60 s) when a kill lands mid-try: room for that
SERVE_DEADLINE = 90
BOTH = ["approval.requested", "approval.decided"]
#: a public address literal: no DNS lookup, and no test ever delivers to it
PUBLIC_URL = "https://1.1.1.1/agentauth"
APPROVAL_RULES = [{"type": "require_approval", "tools": ["x"]}, {"type": "tool_allowlist"}]


# --- a receiver on a real socket ------------------------------------------------------------


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]  # names in lower case
    body: bytes
    answered: int


class Receiver:
    """An HTTP server on 127.0.0.1, a port of its own, in a thread. Each POST is answered with
    the next of :meth:`answer`'s statuses (the last one repeats) and kept in ``requests``."""

    def __init__(self) -> None:
        self.requests: list[Received] = []
        self._statuses = [200]
        self._changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                headers = {name.lower(): value for name, value in self.headers.items()}
                with receiver._changed:
                    statuses = receiver._statuses
                    status = statuses.pop(0) if len(statuses) > 1 else statuses[0]
                    receiver.requests.append(Received(self.path, headers, body, status))
                    receiver._changed.notify_all()
                self.send_response(status)
                if 300 <= status < 400:
                    self.send_header("Location", receiver.url("/elsewhere"))
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def url(self, path: str = "/hook", host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def answer(self, *statuses: int) -> None:
        with self._changed:
            self._statuses = list(statuses)

    def wait_for(self, count: int, deadline: float = DEADLINE) -> list[Received]:
        with self._changed:
            arrived = self._changed.wait_for(lambda: len(self.requests) >= count, deadline)
            assert arrived, f"{len(self.requests)} of {count} requests after {deadline} s"
            return list(self.requests)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(DEADLINE)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver()
    yield found
    found.close()


@pytest.fixture
def allowing(settings, clock):
    """A client of an app with AGENTAUTH_WEBHOOK_ALLOW_PRIVATE=true: the receivers of these
    tests listen on 127.0.0.1. Same database and clock as ``client``."""
    app = create_app(replace(settings, webhook_allow_private=True), clock=clock)
    yield app.test_client()
    app.extensions["agentauth"].close()


@pytest.fixture(autouse=True)
def _no_deliveries_left(app, workspace, other_workspace) -> Iterator[None]:
    yield
    with app.extensions["agentauth"].db.transaction(write=True) as session:
        wanted = select(Webhook).where(Webhook.workspace_id.in_([workspace.id, other_workspace.id]))
        for row in session.scalars(wanted):
            session.delete(row)  # its deliveries go with it


# --- helpers --------------------------------------------------------------------------------


def create(client, headers, url: str, events: list[str] = BOTH, **extra: Any) -> dict[str, Any]:
    response = client.post(
        "/v1/webhooks", json={"url": url, "events": events, **extra}, headers=headers
    )
    assert response.status_code == 201, response.get_data(as_text=True)
    return dict(response.json)


def listed(client, headers) -> list[dict[str, Any]]:
    response = client.get("/v1/webhooks", headers=headers)
    assert response.status_code == 200, response.get_data(as_text=True)
    return list(response.json["data"])


def records(client, headers, webhook_id: str) -> list[dict[str, Any]]:
    response = client.get(f"/v1/webhooks/{webhook_id}/deliveries", headers=headers)
    assert response.status_code == 200, response.get_data(as_text=True)
    return list(response.json["data"])


def escalate(client, headers, agent_id: str, **parameters: Any) -> dict[str, Any]:
    """An authorize call that needs an approval: one approval.requested event."""
    decision = decide(client, headers, agent_id, "x", **parameters)
    assert decision["outcome"] == "escalated", decision
    return decision


def run_pass(app, clock, workspace, *, allow_private: bool = True) -> list[str]:
    db = app.extensions["agentauth"].db
    done = deliver_due(db, clock, allow_private=allow_private, workspace_id=workspace.id)
    return [str(status) for status in done]


def signed_correctly(secret: str, request: Received) -> bool:
    t, v1 = re.fullmatch(
        r"t=(\d+),v1=([0-9a-f]{64})", request.headers["x-agentauth-signature"]
    ).groups()
    expected = hmac.new(secret.encode(), t.encode() + b"." + request.body, hashlib.sha256)
    return hmac.compare_digest(expected.hexdigest(), v1)


def counted(result: str) -> float:
    return (
        REGISTRY.get_sample_value("agentauth_webhook_deliveries_total", {"result": result}) or 0.0
    )


def readme_python() -> list[str]:
    """The Python blocks of the README's Webhooks section, in order."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### Webhooks\n", 1)[1].split("\n### ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


# --- managing webhooks ----------------------------------------------------------------------


def test_create_list_and_delete(client, admin_headers):
    first = create(client, admin_headers, PUBLIC_URL, BOTH, description="on-call")
    assert re.fullmatch(r"[0-9a-f]{64}", first["secret"])
    assert first["events"] == ["approval.decided", "approval.requested"]
    assert first["description"] == "on-call"
    assert first["url"] == PUBLIC_URL
    second = create(client, admin_headers, "http://8.8.8.8:8080/b?c=d", ["approval.decided"])
    assert second["description"] is None
    assert second["secret"] != first["secret"]

    shown = listed(client, admin_headers)
    assert [hook["id"] for hook in shown] == [second["id"], first["id"]]  # newest first
    assert all(set(hook) == {"id", "url", "events", "description", "createdAt"} for hook in shown)
    assert shown[1] == {key: value for key, value in first.items() if key != "secret"}

    assert client.delete(f"/v1/webhooks/{first['id']}", headers=admin_headers).status_code == 204
    assert [hook["id"] for hook in listed(client, admin_headers)] == [second["id"]]
    again = client.delete(f"/v1/webhooks/{first['id']}", headers=admin_headers)
    assert_error(again, 404, "WEBHOOK_NOT_FOUND")


def test_the_list_pages(client, admin_headers):
    made = [create(client, admin_headers, PUBLIC_URL)["id"] for _ in range(3)]
    page = client.get("/v1/webhooks?limit=2&offset=1", headers=admin_headers).json
    assert [hook["id"] for hook in page["data"]] == [made[1], made[0]]
    assert page["pagination"] == {"limit": 2, "offset": 1, "count": 2, "total": 3}
    assert_error(
        client.get("/v1/webhooks?limit=201", headers=admin_headers), 400, "VALIDATION_ERROR"
    )


LONG = "https://1.1.1.1/" + "a" * (2048 - len("https://1.1.1.1/"))


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"events": BOTH}, "url"),
        ({"url": PUBLIC_URL}, "events"),
        ({"url": PUBLIC_URL, "events": []}, "events"),
        ({"url": PUBLIC_URL, "events": ["approval.decided", "approval.decided"]}, "events"),
        ({"url": PUBLIC_URL, "events": ["approval.created"]}, "events[0]"),
        ({"url": PUBLIC_URL, "events": "approval.decided"}, "events"),
        ({"url": "ftp://1.1.1.1/hook", "events": BOTH}, "url"),
        ({"url": "1.1.1.1/hook", "events": BOTH}, "url"),
        ({"url": LONG + "a", "events": BOTH}, "url"),
        ({"url": "https://1.1.1.1/a b", "events": BOTH}, "url"),
        ({"url": "https://1.1.1.1/\u00e9", "events": BOTH}, "url"),
        ({"url": "https:///path", "events": BOTH}, "url"),
        ({"url": "https://user:pw@1.1.1.1/", "events": BOTH}, "url"),
        ({"url": "https://1.1.1.1:99999/", "events": BOTH}, "url"),
        ({"url": "http://[::1/", "events": BOTH}, "url"),
        ({"url": 5, "events": BOTH}, "url"),
        ({"url": PUBLIC_URL, "events": BOTH, "description": "d" * 2001}, "description"),
        ({"url": PUBLIC_URL, "events": BOTH, "secret": "mine"}, "secret"),
    ],
    ids=[
        "no-url", "no-events", "no-event", "repeated-event", "unknown-event", "events-string",
        "ftp", "no-scheme", "url-2049", "space", "non-ascii", "no-host", "credentials",
        "bad-port", "broken-ipv6", "url-number", "description-2001", "unknown-field",
    ],
)  # fmt: skip
def test_an_invalid_body_is_400_and_creates_nothing(client, admin_headers, body, field):
    error = assert_error(
        client.post("/v1/webhooks", json=body, headers=admin_headers), 400, "VALIDATION_ERROR"
    )
    assert field in [detail["field"] for detail in error["details"]], error
    assert listed(client, admin_headers) == []


def test_a_url_of_2048_characters_is_taken(client, admin_headers):
    assert len(LONG) == 2048
    assert create(client, admin_headers, LONG)["url"] == LONG


def test_unknown_malformed_and_foreign_ids(client, admin_headers, other_workspace):
    theirs = create(client, other_workspace.headers("admin"), PUBLIC_URL)["id"]
    unknown = "6f0b2a44-0d8e-4a3c-9a57-2f7e1c7d9b10"
    for wanted in (unknown, theirs):
        assert_error(
            client.delete(f"/v1/webhooks/{wanted}", headers=admin_headers), 404, "WEBHOOK_NOT_FOUND"
        )
        deliveries = client.get(f"/v1/webhooks/{wanted}/deliveries", headers=admin_headers)
        assert_error(deliveries, 404, "WEBHOOK_NOT_FOUND")
    assert listed(client, admin_headers) == []
    assert [hook["id"] for hook in listed(client, other_workspace.headers("admin"))] == [theirs]
    assert_error(client.delete("/v1/webhooks/nope", headers=admin_headers), 400, "VALIDATION_ERROR")
    malformed = client.get("/v1/webhooks/nope/deliveries", headers=admin_headers)
    assert_error(malformed, 400, "VALIDATION_ERROR")


def test_a_read_only_key_may_do_nothing_with_webhooks(client, admin_headers, readonly_headers):
    hook = create(client, admin_headers, PUBLIC_URL)["id"]
    attempts = [
        client.post(
            "/v1/webhooks", json={"url": PUBLIC_URL, "events": BOTH}, headers=readonly_headers
        ),
        client.get("/v1/webhooks", headers=readonly_headers),
        client.delete(f"/v1/webhooks/{hook}", headers=readonly_headers),
        client.get(f"/v1/webhooks/{hook}/deliveries", headers=readonly_headers),
    ]
    for response in attempts:
        assert_error(response, 403, "INSUFFICIENT_SCOPE")
    assert [found["id"] for found in listed(client, admin_headers)] == [hook]


# --- addresses ------------------------------------------------------------------------------

NON_PUBLIC = [
    "http://127.0.0.1/hook",
    "http://10.1.2.3/hook",
    "http://172.16.5.4/hook",
    "http://192.168.0.10/hook",
    "http://169.254.169.254/latest/meta-data",
    "http://0.0.0.0/hook",
    "http://224.0.0.1/hook",
    "http://2130706433/hook",  # 127.0.0.1 written as one number
    "http://[::1]:8080/hook",
    "http://[::ffff:127.0.0.1]/hook",
    "http://[::ffff:10.0.0.1]/hook",
    "http://[fe80::1]/hook",
    "http://[fc00::1]/hook",
    "http://localhost:8080/hook",
]


@pytest.mark.parametrize("url", NON_PUBLIC)
def test_a_url_reaching_a_non_public_address_is_refused(client, admin_headers, url):
    response = client.post("/v1/webhooks", json={"url": url, "events": BOTH}, headers=admin_headers)
    error = assert_error(response, 400, "VALIDATION_ERROR")
    assert [detail["field"] for detail in error["details"]] == ["url"]
    assert "AGENTAUTH_WEBHOOK_ALLOW_PRIVATE" in error["message"]
    assert listed(client, admin_headers) == []


@pytest.mark.parametrize("url", NON_PUBLIC)
def test_the_setting_allows_non_public_addresses(allowing, admin_headers, url):
    assert create(allowing, admin_headers, url)["url"] == url


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("10.0.0.1", "private"),
        ("100.64.0.1", "not globally routable"),  # carrier-grade NAT
        ("169.254.1.1", "link-local"),
        ("239.1.2.3", "multicast"),
        ("240.0.0.1", "reserved"),
        ("0.0.0.0", "unspecified"),  # noqa: S104 (an address judged, not bound)
        ("::", "unspecified"),
        ("::1", "loopback"),
        ("::ffff:192.168.1.1", "private"),
        ("2002:7f00:1::1", "loopback"),  # 6to4 carrying 127.0.0.1
        ("fe80::1%eth0", "link-local"),
        ("8.8.8.8", None),
        ("::ffff:8.8.8.8", None),
        ("2606:4700:4700::1111", None),
    ],
)
def test_which_addresses_are_public(address, reason):
    assert forbidden_reason(address) == reason


def test_the_setting_is_read_from_the_environment():
    assert Settings.from_env({}).webhook_allow_private is False
    for raw, value in (("true", True), ("TRUE", True), ("1", True), ("false", False), ("0", False)):
        assert (
            Settings.from_env({"AGENTAUTH_WEBHOOK_ALLOW_PRIVATE": raw}).webhook_allow_private
            is value
        )
    with pytest.raises(ConfigError, match="AGENTAUTH_WEBHOOK_ALLOW_PRIVATE"):
        Settings.from_env({"AGENTAUTH_WEBHOOK_ALLOW_PRIVATE": "maybe"})


# --- delivering -----------------------------------------------------------------------------


def test_each_event_reaches_each_subscriber_once_signed(
    app, allowing, clock, workspace, admin_headers, receiver
):
    hook = create(allowing, admin_headers, receiver.url(host="localhost"), ["approval.requested"])
    agent = make_agent(allowing, admin_headers, "asks", APPROVAL_RULES)
    first = escalate(allowing, admin_headers, agent, n=1)
    before = counted("delivered")

    assert run_pass(app, clock, workspace) == ["delivered"]
    tried_at = clock.moment
    assert run_pass(app, clock, workspace) == []  # delivered: never again
    [request] = receiver.requests
    assert request.path == "/hook"
    assert (
        request.headers["host"] == f"localhost:{receiver.port}"
    )  # the URL's host, sent to 127.0.0.1
    assert request.headers["content-type"] == "application/json"
    event = json.loads(request.body)
    assert list(event) == ["id", "type", "createdAt", "data"]
    assert event["type"] == "approval.requested"
    assert request.headers["x-agentauth-event-id"] == event["id"]
    assert event["data"]["id"] == first["approvalId"]
    assert event["data"]["status"] == "pending"
    assert event["data"]["toolName"] == "x"
    assert signed_correctly(hook["secret"], request)
    t = int(request.headers["x-agentauth-signature"].split(",")[0].removeprefix("t="))
    assert abs(t - tried_at.timestamp()) < 1  # the time of the try, by the service's clock

    [record] = records(allowing, admin_headers, hook["id"])
    assert record["eventId"] == event["id"]
    assert record["eventType"] == "approval.requested"
    assert (record["attempt"], record["status"], record["responseStatus"]) == (1, "delivered", 200)
    assert record["error"] is None
    assert record["nextAttemptAt"] is None
    assert instant(record["deliveredAt"]) <= tried_at
    assert counted("delivered") == before + 1

    second = escalate(allowing, admin_headers, agent, n=2)  # another call: another approval
    assert run_pass(app, clock, workspace) == ["delivered"]
    assert [json.loads(r.body)["data"]["id"] for r in receiver.requests] == [
        first["approvalId"], second["approvalId"],
    ]  # fmt: skip
    assert len({r.headers["x-agentauth-event-id"] for r in receiver.requests}) == 2


def test_the_readme_checks_signatures_as_the_service_makes_them(
    app, allowing, clock, workspace, admin_headers, receiver
):
    hook = create(allowing, admin_headers, receiver.url())
    escalate(allowing, admin_headers, make_agent(allowing, admin_headers, "asks", APPROVAL_RULES))
    run_pass(app, clock, workspace)
    [request] = receiver.requests
    namespace: dict[str, Any] = {}
    exec(readme_python()[0], namespace)  # noqa: S102 (the README's own example)
    verify = namespace["verify"]
    signature = request.headers["x-agentauth-signature"]
    forever = 10**10  # the test's clock is days behind the real one
    assert verify(hook["secret"], request.body, signature, tolerance=forever)
    assert not verify(hook["secret"], request.body + b" ", signature, tolerance=forever)
    assert not verify("0" * 64, request.body, signature, tolerance=forever)
    assert not verify(hook["secret"], request.body, signature)  # signed days ago: a replay


def test_the_readme_relay_posts_a_chat_message(
    settings, workspace, admin_headers, receiver, monkeypatch
):
    """The README's relay as written (on a port of its own) between a webhook and a chat tool's
    incoming webhook (``receiver``). The service runs on the real clock here: the relay checks
    signatures with the README's 5-minute tolerance."""
    app = create_app(replace(settings, webhook_allow_private=True))
    verify_code, relay_code = readme_python()
    relay_code, serve_line = relay_code.rstrip().rsplit("\n", 1)
    assert serve_line.startswith("HTTPServer(")
    monkeypatch.setenv("CHAT_WEBHOOK_URL", receiver.url("/chat"))
    monkeypatch.setenv("AGENTAUTH_WEBHOOK_SECRET", "known once the webhook exists")
    namespace: dict[str, Any] = {}
    exec(verify_code + relay_code, namespace)  # noqa: S102 (the README's own example)
    relay = ThreadingHTTPServer(("127.0.0.1", 0), namespace["Relay"])
    threading.Thread(target=relay.serve_forever, daemon=True).start()
    relay_url = f"http://127.0.0.1:{relay.server_address[1]}/"
    try:
        client = app.test_client()
        hook = create(client, admin_headers, relay_url)
        namespace["SECRET"] = hook["secret"]
        agent = make_agent(client, admin_headers, "asks", APPROVAL_RULES)
        decision = escalate(client, admin_headers, agent)
        db = app.extensions["agentauth"].db
        done = deliver_due(db, utc_now, allow_private=True, workspace_id=workspace.id)
        assert [str(status) for status in done] == ["delivered"]
        [message] = receiver.requests
        assert message.path == "/chat"
        sent = json.loads(message.body)["text"]
        approval = decision["approvalId"]
        assert sent == f"approval.requested: x by agent {agent} is pending (approval {approval})"
        [record] = records(client, admin_headers, hook["id"])
        assert record["responseStatus"] == 204
        forged = httpx.post(
            relay_url, content=b"{}", headers={"X-Agentauth-Signature": "t=1,v1=00"}
        )
        assert forged.status_code == 401
        assert len(receiver.requests) == 1
    finally:
        relay.shutdown()
        relay.server_close()
        app.extensions["agentauth"].close()


def test_only_subscribers_of_the_workspace_get_an_event(
    app, allowing, clock, workspace, other_workspace, admin_headers, receiver
):
    requested = create(allowing, admin_headers, receiver.url("/requested"), ["approval.requested"])
    decided = create(allowing, admin_headers, receiver.url("/decided"), ["approval.decided"])
    create(allowing, other_workspace.headers("admin"), receiver.url("/other"), BOTH)
    escalate(allowing, admin_headers, make_agent(allowing, admin_headers, "asks", APPROVAL_RULES))
    recorder = app.extensions["agentauth"].recorder
    data = {"id": "an approval", "status": "approved"}
    recorder.run(
        lambda batch: enqueue(
            batch, recorder.statements.approvals, workspace.id, "approval.decided", data, clock()
        )
    )
    assert run_pass(app, clock, workspace) == ["delivered", "delivered"]
    by_path = {request.path: json.loads(request.body) for request in receiver.requests}
    assert set(by_path) == {"/requested", "/decided"}
    assert by_path["/requested"]["type"] == "approval.requested"
    assert by_path["/decided"] == {**by_path["/decided"], "type": "approval.decided", "data": data}
    assert len(records(allowing, admin_headers, requested["id"])) == 1
    assert len(records(allowing, admin_headers, decided["id"])) == 1
    assert run_pass(app, clock, other_workspace) == []  # nothing was stored for them


def test_500_twice_then_200_is_three_tries_and_one_delivery(
    app, allowing, clock, workspace, admin_headers, receiver
):
    receiver.answer(500, 500, 200)
    hook = create(allowing, admin_headers, receiver.url())
    escalate(allowing, admin_headers, make_agent(allowing, admin_headers, "asks", APPROVAL_RULES))
    retries, delivered = counted("retry"), counted("delivered")

    waits = []
    for expected in ("pending", "pending"):
        assert run_pass(app, clock, workspace) == [expected]
        [record] = records(allowing, admin_headers, hook["id"])
        assert (record["status"], record["responseStatus"]) == ("pending", 500)
        assert record["error"] == "answered 500"
        due = instant(record["nextAttemptAt"])
        waits.append(due - clock.moment)
        clock.moment = due - timedelta(milliseconds=10)
        assert run_pass(app, clock, workspace) == []  # not before it is due
        clock.moment = due
    assert run_pass(app, clock, workspace) == ["delivered"]

    assert [request.answered for request in receiver.requests] == [500, 500, 200]
    assert len({request.body for request in receiver.requests}) == 1  # the same event each time
    assert all(signed_correctly(hook["secret"], request) for request in receiver.requests)
    assert [round(wait.total_seconds()) for wait in waits] == [1, 2]
    [record] = records(allowing, admin_headers, hook["id"])
    assert (record["attempt"], record["status"], record["responseStatus"]) == (3, "delivered", 200)
    assert record["error"] is None
    assert (counted("retry"), counted("delivered")) == (retries + 2, delivered + 1)


def test_the_wait_doubles_to_ten_minutes_and_a_day_later_the_delivery_fails(
    app, allowing, clock, workspace, admin_headers
):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, never listening: every connection is refused
        hook = create(allowing, admin_headers, f"http://127.0.0.1:{closed.getsockname()[1]}/")
        escalate(
            allowing, admin_headers, make_agent(allowing, admin_headers, "asks", APPROVAL_RULES)
        )
        [record] = records(allowing, admin_headers, hook["id"])
        created = instant(record["createdAt"])
        failed = counted("failed")
        waits, tries = [], []
        while True:
            assert run_pass(app, clock, workspace) in (["pending"], ["failed"])
            tries.append(clock.moment)
            [record] = records(allowing, admin_headers, hook["id"])
            if record["status"] == "failed":
                break
            assert "could not connect to 127.0.0.1" in record["error"]
            clock.moment = instant(record["nextAttemptAt"])
            waits.append(clock.moment - tries[-1])
    doubling = [2**n for n in range(10)]  # 1 s ... 512 s
    assert [wait.total_seconds() for wait in waits[:10]] == doubling
    assert {wait.total_seconds() for wait in waits[10:]} == {600}
    assert created + timedelta(hours=24) - timedelta(minutes=10) < tries[-1]
    assert tries[-1] <= created + timedelta(hours=24, seconds=1)
    assert (record["attempt"], record["nextAttemptAt"]) == (len(tries), None)
    assert counted("failed") == failed + 1
    clock.advance(86_400)
    assert run_pass(app, clock, workspace) == []  # failed for good


def test_the_wait_after_each_failed_try():
    assert [retry_delay(n).total_seconds() for n in range(1, 13)] == [
        1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 600, 600,
    ]  # fmt: skip
    assert retry_delay(1000).total_seconds() == 600


def test_a_redirect_is_not_followed(app, allowing, clock, workspace, admin_headers, receiver):
    receiver.answer(302)
    hook = create(allowing, admin_headers, receiver.url())
    escalate(allowing, admin_headers, make_agent(allowing, admin_headers, "asks", APPROVAL_RULES))
    assert run_pass(app, clock, workspace) == ["pending"]
    assert [request.path for request in receiver.requests] == ["/hook"]
    [record] = records(allowing, admin_headers, hook["id"])
    assert (record["status"], record["responseStatus"]) == ("pending", 302)
    assert record["error"] == "answered 302: redirects are not followed"


def test_the_address_is_checked_again_at_each_try(
    app, allowing, clock, workspace, admin_headers, receiver
):
    """Made while the setting allowed it, a webhook to 127.0.0.1 is not delivered once the
    worker's setting refuses: the try fails, and is retried like any failure."""
    hook = create(allowing, admin_headers, receiver.url(host="localhost"))
    escalate(allowing, admin_headers, make_agent(allowing, admin_headers, "asks", APPROVAL_RULES))
    assert run_pass(app, clock, workspace, allow_private=False) == ["pending"]
    assert receiver.requests == []
    [record] = records(allowing, admin_headers, hook["id"])
    assert record["responseStatus"] is None
    assert "localhost resolves to 127.0.0.1, a non-public (loopback) address" in record["error"]
    clock.moment = instant(record["nextAttemptAt"])
    assert run_pass(app, clock, workspace, allow_private=True) == ["delivered"]
    assert len(receiver.requests) == 1


def test_a_deleted_webhook_gets_nothing_more(
    app, allowing, clock, workspace, admin_headers, receiver
):
    hook = create(allowing, admin_headers, receiver.url())
    escalate(allowing, admin_headers, make_agent(allowing, admin_headers, "asks", APPROVAL_RULES))
    assert allowing.delete(f"/v1/webhooks/{hook['id']}", headers=admin_headers).status_code == 204
    assert run_pass(app, clock, workspace) == []
    assert receiver.requests == []


def test_workers_sharing_the_database_deliver_each_event_once(
    app, allowing, clock, settings, workspace, admin_headers, receiver
):
    """Four workers, each with its database engine of its own as in separate processes, take
    the outbox at the same moment: every event arrives once."""
    create(allowing, admin_headers, receiver.url())
    agent = make_agent(allowing, admin_headers, "asks", APPROVAL_RULES)
    approvals = {escalate(allowing, admin_headers, agent, n=n)["approvalId"] for n in range(8)}
    databases = [Database(settings) for _ in range(4)]
    start = threading.Barrier(len(databases))
    done: list[list[Any]] = []
    failures: list[BaseException] = []

    def work(db: Database) -> None:
        try:
            start.wait(DEADLINE)
            done.append(deliver_due(db, clock, allow_private=True, workspace_id=workspace.id))
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(db,)) for db in databases]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(DEADLINE)
    finally:
        for db in databases:
            db.dispose()
    assert failures == []
    assert sum(len(statuses) for statuses in done) == len(approvals)
    arrived = [json.loads(request.body)["data"]["id"] for request in receiver.requests]
    assert sorted(arrived) == sorted(approvals)


def test_a_lease_left_by_a_killed_worker_expires(
    app, allowing, clock, workspace, admin_headers, receiver
):
    """A worker that took a delivery and died before recording a try: the delivery waits for
    its lease to run out, then the next pass makes it."""
    hook = create(allowing, admin_headers, receiver.url())
    escalate(allowing, admin_headers, make_agent(allowing, admin_headers, "asks", APPROVAL_RULES))
    db = app.extensions["agentauth"].db
    now = clock()
    with db.transaction(write=True) as session:
        assert len(lease(session, find_due(session, now, 10, workspace.id), now, now + LEASE)) == 1
    with db.transaction(write=True) as session:  # another worker finds it taken
        assert lease(session, find_due(session, now, 10, workspace.id), now, now + LEASE) == []
    assert run_pass(app, clock, workspace) == []
    clock.moment = now + LEASE
    assert run_pass(app, clock, workspace) == ["delivered"]
    assert len(receiver.requests) == 1
    [record] = records(allowing, admin_headers, hook["id"])
    assert (record["attempt"], record["status"]) == (1, "delivered")


def test_metrics_show_the_delivery_counts(client):
    exposition = client.get("/metrics").get_data(as_text=True)
    for result in ("delivered", "retry", "failed"):
        assert f'agentauth_webhook_deliveries_total{{result="{result}"}}' in exposition


# --- a real server, killed and started again -------------------------------------------------


@pytest.fixture
def own_database_url(tmp_path) -> Iterator[str]:
    """A database of this test's own, so that the server's worker meets no delivery of other
    tests: a SQLite file, or a fresh PostgreSQL schema (dropped at the end)."""
    base = os.environ.get(PG_ENV)
    if not base:
        yield f"sqlite:///{tmp_path / 'webhooks.db'}"
        return
    with postgresql_schema(base, "agentauth_webhooks") as url:
        yield url


def _wait_until(what: str, condition: Any, deadline: float = SERVE_DEADLINE) -> None:
    end = time.monotonic() + deadline
    while not condition():
        assert time.monotonic() < end, f"still waiting for {what} after {deadline} s"
        time.sleep(0.05)  # polling another process's writes to the database, bounded above


@pytest.mark.slow
def test_a_delivery_pending_when_serve_is_killed_is_made_after_the_restart(
    own_database_url, receiver
):
    settings = Settings(database_url=own_database_url, webhook_allow_private=True)
    open_database(settings, write=True).dispose()
    app = create_app(settings)
    try:
        headers = Tenant(app, "webhooks", FakeClock(utc_now())).headers("admin")
        client = app.test_client()
        receiver.answer(500)  # until told otherwise
        hook = create(client, headers, receiver.url(host="localhost"))
        escalate(client, headers, make_agent(client, headers, "asks", APPROVAL_RULES))
        env = {"AGENTAUTH_WEBHOOK_ALLOW_PRIVATE": "true"}

        def tried() -> int:
            return int(records(client, headers, hook["id"])[0]["attempt"])

        with server_process(own_database_url, workers=2, threads=2, env=env) as server:
            # the master, its two web workers and one delivery worker (however many web workers)
            _wait_until("every server process", lambda: len(server.pids()) == 4, DEADLINE)
            receiver.wait_for(1, SERVE_DEADLINE)
            _wait_until("the failed try to be recorded", lambda: tried() >= 1)
            server.kill()
        [record] = records(client, headers, hook["id"])
        assert record["status"] == "pending"
        receiver.answer(200)

        with server_process(own_database_url, workers=2, threads=2, env=env) as server:
            _wait_until(
                "the delivery after the restart",
                lambda: records(client, headers, hook["id"])[0]["status"] == "delivered",
            )
            # counted by the delivery worker, scraped from a web worker: one metrics folder
            scraped = httpx.get(server.base + "/metrics", timeout=DEADLINE).text
            assert 'agentauth_webhook_deliveries_total{result="delivered"} 1.0' in scraped
            _wait_until("every server process", lambda: len(server.pids()) == 4, DEADLINE)
            server.process.send_signal(signal.SIGTERM)
            assert server.process.wait(timeout=DEADLINE) == 0
            assert session_members(server.master) == []  # the delivery worker stopped too
        answered = [request.answered for request in receiver.requests]
        assert answered.count(200) == 1
        assert set(answered) == {500, 200}
        assert len({request.headers["x-agentauth-event-id"] for request in receiver.requests}) == 1
        assert all(signed_correctly(hook["secret"], request) for request in receiver.requests)
        [record] = records(client, headers, hook["id"])
        assert record["attempt"] >= 2
    finally:
        app.extensions["agentauth"].close()
