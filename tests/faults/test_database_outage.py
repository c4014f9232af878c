"""Fail closed, then recover: while the database is unavailable (PostgreSQL stopped, or another
process holding SQLite's write lock; see ``outages.py``), authorize answers 500 with the error
body and never allows; nothing is audited for those calls. When the database returns, the same
server processes answer 200 again by themselves, and the audit log holds exactly the decisions
that were answered.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx
import pytest
from sqlalchemy import create_engine, select

from core.store.database import normalize_url
from core.store.models import AuditEntry
from tests.api.helpers import make_agent
from tests.conftest import bearer
from tests.faults.outages import Outage, PostgresProxy, outage_of
from tests.faults.traffic import CALL_TIMEOUT, Answer, Traffic
from tests.server import server_process

pytestmark = pytest.mark.slow  # real server processes

CLIENTS = 4
ANSWERS_UP = 40  # before the outage
#: while it lasts, one per client: on SQLite each of these calls waits BUSY_TIMEOUT_MS for the
#: lock before it fails, so more would only make the phase longer, not the check surer
ANSWERS_DOWN = CLIENTS
ANSWERS_BACK = 40  # sent once the first call after it was answered 200
#: hang guards, far above what each phase takes
PHASE_SECONDS = 60
#: a write waits this long for SQLite's lock before failing, rather than the default 30 s. The
#: calls before and after the outage must never be refused for the two workers' own commits, so
#: it is of a hang guard's order, not an estimate of a commit's time on a loaded machine; the
#: outage phase pays it once per client (ANSWERS_DOWN)
BUSY_TIMEOUT_MS = 10_000
SERVER_ENV = {
    "AGENTAUTH_RATE_LIMIT_PER_MINUTE": "1000000",
    "AGENTAUTH_SQLITE_BUSY_TIMEOUT_MS": str(BUSY_TIMEOUT_MS),
}
TOOLS = ("files.read", "files.delete", "shell.exec")
RULES = [
    {"type": "tool_denylist", "tools": ["*.delete"]},
    {"type": "tool_allowlist", "tools": ["files.*"]},
]


def test_authorize_fails_closed_while_the_database_is_down_and_recovers_by_itself(
    database_url, client, workspace
):
    agent_id = make_agent(client, workspace.headers("admin"), "outage-agent", RULES)
    key = workspace.key("read-only")
    with (
        outage_of(database_url) as outage,
        server_process(outage.url, workers=2, threads=4, env=SERVER_ENV) as server,
    ):
        processes = server.pids()
        run = _serve_through_outage(server.base, key, agent_id, outage)
        assert server.pids() == processes, "a server process was replaced: that is no recovery"
        # a failed call is not charged to its key: nothing waits on the database again for it
        assert "could not count a failed request" not in server.log_text()

    down = [a for a in run.traffic.answers if a.answered_in == "down"]
    print(  # the figures, shown when the test fails (or under -s)
        f"{len(run.up.answers)} answers before, {len(down)} during the outage "
        f"({run.traffic.summary()}), first 200 {run.recovered_after:.3f} s after the database "
        f"returned; /readyz during: {run.ready_down.status_code}"
    )
    assert run.up.broken + run.traffic.broken == [], "a call got no answer: the server hung"
    assert all(a.status == 200 for a in run.up.answers), run.up.summary()
    assert [a for a in down if a.allowed] == [], "allowed while the database was down"
    for answer in run.up.answers + run.traffic.answers:
        if answer.status != 200:
            _assert_error_body(answer, 500, "INTERNAL_ERROR")
    assert all(a.status == 500 for a in down), f"answered while down: {run.traffic.summary()}"
    late = [a for a in run.traffic.answers if a.sent_in == "recovered" and a.status != 200]
    assert late == [], "failed after the database had returned and been used again"
    assert run.ready_back.status_code == 200, run.ready_back.text
    # /readyz reads, so it sees PostgreSQL gone; SQLite's write lock leaves reads alone (WAL),
    # and /readyz says 200 while every write waits and fails
    if isinstance(outage, PostgresProxy):
        assert run.ready_down.status_code == 503, run.ready_down.text
        assert run.ready_down.json()["error"]["code"] == "NOT_READY"
    else:
        assert run.ready_down.status_code in (200, 503), run.ready_down.text
    _assert_audited_exactly(database_url, workspace.id, run.up.answers + run.traffic.answers)


@dataclass
class OutageRun:
    up: Traffic  # the calls before the outage
    traffic: Traffic  # the calls during it, and after
    ready_down: httpx.Response  # /readyz during the outage, and after it
    ready_back: httpx.Response
    recovered_after: float  # seconds from the database's return to the first 200


def _serve_through_outage(base: str, key: str, agent_id: str, outage: Outage) -> OutageRun:
    """Calls before the outage; then, with no call in flight (each call after meets the outage
    whole), the database goes away under calls that go on until it has been back a while.
    Phases of the second traffic: ``down``, ``back`` (from just before the database returns)
    and ``recovered`` (from the first 200 after it)."""
    up = Traffic(base, key, agent_id, TOOLS, clients=CLIENTS, name="up").start()
    try:
        up.wait_for(f"{ANSWERS_UP} answers", lambda got: len(got) >= ANSWERS_UP, PHASE_SECONDS)
    finally:
        up.stop()
    outage.begin()
    down = True
    traffic = Traffic(base, key, agent_id, TOOLS, clients=CLIENTS, name="outage")
    traffic.mark("down")
    traffic.start()
    try:
        traffic.wait_for(
            f"{ANSWERS_DOWN} answers during the outage",
            lambda got: sum(a.answered_in == "down" for a in got) >= ANSWERS_DOWN,
            PHASE_SECONDS,
        )
        ready_down = httpx.get(base + "/readyz", timeout=CALL_TIMEOUT)
        traffic.mark("back")
        outage.end()
        down = False
        returned = time.monotonic()
        traffic.wait_for("a 200 after the database returned", _any_ok, PHASE_SECONDS)
        recovered_after = time.monotonic() - returned
        traffic.mark("recovered")
        traffic.wait_for(
            f"{ANSWERS_BACK} answers to calls sent after recovery",
            lambda got: sum(a.sent_in == "recovered" for a in got) >= ANSWERS_BACK,
            PHASE_SECONDS,
        )
    finally:
        if down:  # failed during the outage: end it, so that nothing waits on it any longer
            outage.end()
        traffic.stop()
    ready_back = httpx.get(base + "/readyz", timeout=CALL_TIMEOUT)
    return OutageRun(up, traffic, ready_down, ready_back, recovered_after)


def test_a_database_that_returns_while_the_server_is_idle_costs_no_decision(
    database_url, client, workspace
):
    """The database goes away and comes back while nothing is asked: the very next calls are
    answered 200 (one worker, so the connection it kept from before is the one that broke)."""
    agent_id = make_agent(client, workspace.headers("admin"), "idle-agent", RULES)
    key = workspace.key("read-only")
    body = {"agent_id": agent_id, "tool_name": "files.read", "parameters": {}}
    with (
        outage_of(database_url) as outage,
        server_process(outage.url, workers=1, threads=2, env=SERVER_ENV) as server,
        httpx.Client(base_url=server.base, headers=bearer(key), timeout=CALL_TIMEOUT) as http,
    ):
        before = http.post("/v1/authorize", json=body)
        assert before.status_code == 200, before.text
        outage.begin()
        outage.end()
        after = [http.post("/v1/authorize", json=body) for _ in range(3)]
    assert [response.status_code for response in after] == [200] * 3, after[0].text
    assert all(response.json()["allowed"] for response in after)


def _any_ok(got: list[Answer]) -> bool:
    return any(a.status == 200 for a in got if a.answered_in != "down")


def _assert_error_body(answer: Answer, status: int, code: str) -> None:
    """The spec's error body, and nothing that could pass for a decision; and the request id
    that finds the failure in the server's log."""
    assert answer.status == status, answer
    assert answer.request_id, answer
    assert isinstance(answer.body, dict), answer
    assert set(answer.body) == {"error"}, answer
    assert answer.body["error"]["code"] == code, answer
    assert answer.body["error"]["message"], answer
    assert not answer.allowed


def _assert_audited_exactly(database_url: str, workspace_id: str, answers: list[Answer]) -> None:
    """One entry per 200 answer, the decision it reported; none for any other call."""
    engine = create_engine(normalize_url(database_url))
    try:
        with engine.connect() as connection:
            table = AuditEntry.__table__
            rows = connection.execute(select(table).where(table.c.workspace_id == workspace_id))
            found = rows.all()
    finally:
        engine.dispose()
    entries = {entry.parameters["seq"]: entry for entry in found}
    assert len(entries) == len(found), "a call audited twice"
    answered = {a.seq: a for a in answers if a.status == 200}
    assert set(entries) == set(answered), "audited calls differ from the calls answered 200"
    for seq, answer in answered.items():
        entry = entries[seq]
        assert entry.id == answer.body["auditId"]
        assert entry.result == answer.body["outcome"]
        assert (entry.result == "allowed") is answer.body["allowed"]
