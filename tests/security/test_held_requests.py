"""A request held back by its client is decided when its body has arrived, and a counter never
moves back to an older window (#22, finding 1).

The attack: rule ``maxCalls: 2, windowSeconds: 5``; send a call's headers and most of its body
just before a window ends, make three calls in the next window (allowed, allowed, denied), then
send the rest of the held body. Decided at the instant its headers came, the held call was
counted in the old window, which reset the new window's counter: five calls allowed in one
window of two. Here the held body is a stream that waits for the test, so the same sequence
runs in process, on both databases.
"""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from flask import Flask

from api import create_app
from core.config import Settings
from core.domain.limits import Charge, LimitRef, MemoryCounters, Refusal
from core.store.database import Database
from core.store.limits import consume
from tests.api.helpers import make_agent
from tests.conftest import FakeClock

RULES = [
    {"type": "tool_allowlist", "tools": ["search"]},
    {"type": "rate_limit", "tools": ["search"], "rateLimit": {"maxCalls": 2, "windowSeconds": 5}},
]


class HeldBody(io.BytesIO):
    """A request body that arrives only when the test lets it: ``reading`` is set once the
    server has begun to read it; ``release()`` lets the bytes through."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.reading = threading.Event()
        self._go = threading.Event()

    def _wait(self) -> None:
        self.reading.set()
        if not self._go.wait(timeout=30):
            raise OSError("the test never released the body")

    def read(self, size: int | None = -1) -> bytes:
        self._wait()
        return super().read(size)

    def read1(self, size: int = -1) -> bytes:
        self._wait()
        return super().read1(size)

    def readinto(self, buffer: Any) -> int:
        self._wait()
        return super().readinto(buffer)

    def release(self) -> None:
        self._go.set()


class HeldCall:
    """An authorize call sent on a thread of its own: its headers are in once this returns,
    its body held until :meth:`release`, which gives the answer."""

    def __init__(self, client: Any, body: bytes, headers: dict[str, str]) -> None:
        self.body = HeldBody(body)
        self._answers: list[Any] = []

        def send() -> None:
            self._answers.append(client.post(
                "/v1/authorize", input_stream=self.body, content_length=len(body),
                content_type="application/json", headers=headers,
            ))  # fmt: skip

        self._sender = threading.Thread(target=send)
        self._sender.start()
        assert self.body.reading.wait(timeout=30)  # headers in, body held

    def release(self) -> Any:
        self.body.release()
        self._sender.join(timeout=30)
        return self._answers[0]


@pytest.fixture
def served(settings: Settings, clock: FakeClock) -> Iterator[Flask]:
    """The service as it runs."""
    app = create_app(settings, clock=clock)
    yield app
    app.extensions["agentauth"].close()


def _before_a_boundary(clock: FakeClock, window: int, seconds_before: float) -> None:
    epoch = int(clock.moment.timestamp())
    boundary = (epoch // window + 1) * window
    clock.moment = datetime.fromtimestamp(boundary - seconds_before, UTC)


def test_a_held_call_is_decided_when_its_body_arrives(served, workspace, clock):
    client = served.test_client()
    headers = workspace.headers("admin")
    agent = make_agent(client, headers, rules=RULES)
    body = json.dumps({"agent_id": agent, "tool_name": "search", "parameters": {}}).encode()
    _before_a_boundary(clock, 5, 1.5)
    held = HeldCall(client, body, headers)
    clock.advance(2)  # into the next window

    def call() -> bool:
        answer = client.post("/v1/authorize", json=json.loads(body), headers=headers)
        assert answer.status_code == 200
        return bool(answer.json["allowed"])

    assert [call(), call(), call()] == [True, True, False]
    late = held.release()
    assert late.status_code == 200
    assert late.json["allowed"] is False  # the new window is full: decided now, not then
    assert "rate limit of 2 calls per 5 seconds" in late.json["reason"]
    assert [call(), call(), call()] == [False, False, False]  # the window was not reset
    # its audit entry says when it was decided
    entries = client.get("/v1/audit-logs?limit=10", headers=headers).json["data"]
    held_entry = next(e for e in entries if e["id"] == late.json["auditId"])
    boundary = (int(clock.moment.timestamp()) // 5) * 5
    assert held_entry["timestamp"] >= datetime.fromtimestamp(boundary, UTC).isoformat()[:19]


def test_a_key_that_expires_while_the_body_is_held_is_refused(served, workspace, clock):
    client = served.test_client()
    admin = workspace.headers("admin")
    agent = make_agent(client, admin, rules=RULES)
    expiring = workspace.headers("admin", expires_at=clock.moment + timedelta(seconds=10))
    body = json.dumps({"agent_id": agent, "tool_name": "search", "parameters": {}}).encode()
    held = HeldCall(client, body, expiring)
    clock.advance(20)  # the key expires meanwhile
    answer = held.release()
    assert answer.status_code == 401
    assert answer.json["error"]["code"] == "API_KEY_EXPIRED"
    entries = client.get("/v1/audit-logs", headers=admin).json["data"]
    assert entries == []  # nothing was decided


def test_a_key_revoked_while_the_body_is_held_is_refused(served, workspace, clock):
    client = served.test_client()
    admin = workspace.headers("admin")
    agent = make_agent(client, admin, rules=RULES)
    leaked = workspace.key("admin")
    body = json.dumps({"agent_id": agent, "tool_name": "search", "parameters": {}}).encode()
    held = HeldCall(client, body, {"Authorization": f"Bearer {leaked}"})
    mine = client.get("/v1/whoami", headers={"Authorization": f"Bearer {leaked}"}).json["id"]
    assert client.delete(f"/v1/api-keys/{mine}", headers=admin).status_code == 204
    answer = held.release()
    assert answer.status_code == 401
    assert answer.json["error"]["code"] == "UNAUTHORIZED"
    entries = client.get("/v1/audit-logs", headers=admin).json["data"]
    assert entries == []  # nothing was decided


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer not-a-key", "Basic c3ZjXzA6"],
    ids=["none", "malformed", "basic"],
)
def test_a_call_without_a_key_is_refused_before_its_body_is_read(served, authorization):
    held = HeldBody(b'{"agent_id": "x", "tool_name": "t"}')
    headers = {} if authorization is None else {"Authorization": authorization}
    answer = served.test_client().post(
        "/v1/authorize", input_stream=held, content_length=35,
        content_type="application/json", headers=headers,
    )  # fmt: skip
    assert answer.status_code == 401
    assert not held.reading.is_set()  # never asked for: the body could be held forever


def test_a_database_counter_never_moves_back(database_url):
    db = Database(Settings(database_url=database_url))
    try:
        name = "rule:held:0"
        with db.connect(write=True) as connection:
            assert consume(connection, name, 1_000_005, 2) == (1, 1_000_005)
            # a call of the window before counts in the newer window, never resetting it
            assert consume(connection, name, 1_000_000, 2) == (2, 1_000_005)
            assert consume(connection, name, 1_000_000, 2) is None
            assert consume(connection, name, 1_000_005, 2) is None
            # a later window starts afresh
            assert consume(connection, name, 1_000_010, 2) == (1, 1_000_010)
    finally:
        db.dispose()


def test_memory_counters_never_move_back():
    counters = MemoryCounters()
    limit = LimitRef("p", "policy", 0, 2, 5)
    call = [Charge(limit, limit.counter_key, 1)]
    later = datetime(2026, 11, 25, 12, 0, 5, tzinfo=UTC)
    earlier = later - timedelta(seconds=3)
    assert counters(call, later) is None
    assert counters(call, earlier) is None  # counted in the later window
    window = int(later.timestamp())  # 12:00:05 starts a window of 5 seconds
    assert counters(call, earlier) == Refusal(call[0], 2, window)
    assert counters(call, later) == Refusal(call[0], 2, window)
    assert counters.used(limit, later) == 2
    # the call of the earlier window waits for the end of the later one that refused it
    refused = counters(call, earlier)
    assert refused is not None
    assert refused.retry_after_seconds(earlier) == 8
