"""Crash safety: every process of a loaded server is killed with SIGKILL, several times over,
and nothing a client was told is lost.

Each cycle serves the run's database with two workers while client threads send authorize
calls (allowed, denied by a denylist, default-denied, and rate-limited ones); once enough
answers have arrived, the server's master and both workers are killed at once. Then, before the
next server starts: every 200 answer has its audit entry, with the same decision; no call is
audited twice or without having been made; the rate-limit counter agrees with the allowed
entries it counted; and the database passes its integrity checks. Each restarted server serves
that same audit log.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, create_engine, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from core.store.database import normalize_url
from core.store.models import AuditEntry
from core.store.models import Counter as RateCounter
from tests.api.helpers import make_agent
from tests.conftest import bearer
from tests.faults.traffic import CALL_TIMEOUT, Answer, Traffic
from tests.server import ServerProcess, server_process

pytestmark = pytest.mark.slow  # real server processes

CYCLES = 5
ANSWERS_BEFORE_KILL = 200
CLIENTS = 4
MAX_PAYMENTS = 100  # used up in the second cycle: kills land before, at and past the limit
WINDOW = 3600
#: a hang guard for a cycle's answers, far above what they take
ANSWERS_SECONDS = 60
SERVER_ENV = {"AGENTAUTH_RATE_LIMIT_PER_MINUTE": "1000000"}
TOOLS = ("files.read", "payments.refund", "files.delete", "shell.exec")


def test_sigkill_of_every_server_process_mid_load_loses_no_answered_decision(
    database_url, client, workspace
):
    admin_key = workspace.key("admin")
    agent_id, policies = _agent_with_policies(client, bearer(admin_key))
    key = workspace.key("read-only")
    answers: list[Answer] = []
    sent: list[str] = []
    audited: set[str] = set()
    for cycle in range(CYCLES):
        with server_process(database_url, workers=2, threads=4, env=SERVER_ENV) as server:
            if cycle:  # a restart after a kill: it serves what the crash left
                _check_served_audit_log(server.base, admin_key, agent_id, audited)
            traffic, killed = _load_and_kill(server, key, agent_id, f"cycle{cycle}")
        answers += traffic.answers
        sent += traffic.sent
        audited_before = len(audited)
        audited = _check_database(database_url, workspace.id, policies, answers, sent)
        unanswered = len(audited) - audited_before - len(traffic.answers)
        print(  # the figures, shown when the test fails (or under -s)
            f"cycle {cycle}: {len(traffic.answers)} answers, killed {killed}, "
            f"{len(traffic.broken)} calls cut, {unanswered} audited but unanswered, "
            f"{len(audited)} audit entries checked"
        )
    with server_process(database_url, workers=2, threads=4, env=SERVER_ENV) as server:
        _check_served_audit_log(server.base, admin_key, agent_id, audited)


def _load_and_kill(
    server: ServerProcess, key: str, agent_id: str, name: str
) -> tuple[Traffic, list[int]]:
    """Calls from CLIENTS threads until ANSWERS_BEFORE_KILL have been answered, then SIGKILL
    to the master and both workers while the calls go on; the traffic, and the PIDs killed."""
    workers = server.workers()
    assert len(workers) == 2, server.log_text()
    traffic = Traffic(server.base, key, agent_id, TOOLS, clients=CLIENTS, name=name).start()
    try:
        traffic.wait_for(
            f"{ANSWERS_BEFORE_KILL} answers",
            lambda got: len(got) >= ANSWERS_BEFORE_KILL,
            ANSWERS_SECONDS,
        )
        traffic.mark("killed")
        killed = server.kill()
    finally:
        traffic.stop()
    assert {server.master, *workers} <= set(killed)
    assert not server.pids()
    # a call breaks only when the server dies under it; every complete answer is a decision
    assert all(phase == "killed" for _, phase, _ in traffic.broken), traffic.broken
    assert all(answer.status == 200 for answer in traffic.answers), traffic.summary()
    return traffic, killed


def _agent_with_policies(client, headers) -> tuple[str, dict[str, str]]:
    """The agent, and its policies' ids by name: deletes denied first, then payments allowed
    up to MAX_PAYMENTS per window, then reads allowed; anything else is default-denied."""
    agent_id = make_agent(client, headers, "crash-agent")
    policies = {
        "no-deletes": (100, [{"type": "tool_denylist", "tools": ["*.delete"]}]),
        "payments": (
            50,
            [
                {
                    "type": "rate_limit",
                    "tools": ["payments.*"],
                    "rateLimit": {"maxCalls": MAX_PAYMENTS, "windowSeconds": WINDOW},
                },
                {"type": "tool_allowlist", "tools": ["payments.*"]},
            ],
        ),
        "reads": (10, [{"type": "tool_allowlist", "tools": ["files.read"]}]),
    }
    ids = {}
    for name, (priority, rules) in policies.items():
        body = {"agent_id": agent_id, "name": name, "rules": rules, "priority": priority}
        response = client.post("/v1/policies", json=body, headers=headers)
        assert response.status_code == 201, response.get_data(as_text=True)
        ids[name] = response.json["id"]
    return agent_id, ids


def _check_decision(answer: Answer, policies: dict[str, str]) -> None:
    """The answer is the decision the policies make for its tool."""
    body = answer.body
    expected = {
        "files.read": (True, policies["reads"]),
        "files.delete": (False, policies["no-deletes"]),
        "shell.exec": (False, None),
    }.get(answer.tool)
    if expected is None:  # payments: allowed until the window's calls run out
        assert body["policyId"] == policies["payments"], body
        assert body["allowed"] or body["retryAfterSeconds"] > 0, body
    else:
        assert (body["allowed"], body["policyId"]) == expected, body
    assert body["outcome"] == ("allowed" if body["allowed"] else "denied"), body


def _check_database(
    database_url: str,
    workspace_id: str,
    policies: dict[str, str],
    answers: list[Answer],
    sent: list[str],
) -> set[str]:
    """The database as the kills left it (no server running); the audited entries' ids."""
    engine = create_engine(normalize_url(database_url))
    try:
        if engine.dialect.name == "sqlite":
            _check_sqlite_integrity(str(make_url(database_url).database))
        else:
            print(f"amcheck: {_check_postgres_indexes(engine)} indexes checked")
        with engine.connect() as connection:
            table = AuditEntry.__table__
            rows = connection.execute(select(table).where(table.c.workspace_id == workspace_id))
            entries = rows.all()  # every column read and decoded: nothing is unreadable
            name = f"rule:{policies['payments']}:0"
            counter = connection.execute(
                select(RateCounter.__table__).where(RateCounter.__table__.c.name == name)
            ).first()
    finally:
        engine.dispose()

    by_call: dict[str, Any] = {}
    for entry in entries:
        call = entry.parameters["seq"]
        assert call not in by_call, f"call {call} audited twice"
        by_call[call] = entry
    assert set(by_call) <= set(sent), "an audit entry for a call nobody made"
    for answer in answers:
        _check_decision(answer, policies)
        entry = by_call.get(answer.seq)
        assert entry is not None, f"answered call {answer.seq} has no audit entry: {answer.body}"
        assert entry.id == answer.body["auditId"]
        assert entry.result == answer.body["outcome"]
        assert (entry.result == "allowed") is answer.body["allowed"]
        assert entry.policy_id == answer.body["policyId"]
        assert entry.tool_name == answer.tool
    _check_rate_limit(entries, policies["payments"], counter)
    return {entry.id for entry in entries}


def _check_rate_limit(entries: list[Any], policy_id: str, counter: Any) -> None:
    """Only committed calls count: in each window the first MAX_PAYMENTS audited payments are
    the allowed ones, and the counter holds exactly the allowed entries of its window."""
    calls: Counter[int] = Counter()
    allowed: Counter[int] = Counter()
    for entry in entries:
        if entry.policy_id == policy_id:
            window = int(entry.timestamp.timestamp()) // WINDOW * WINDOW
            calls[window] += 1
            allowed[window] += entry.result == "allowed"
    for window, count in calls.items():
        assert allowed[window] == min(count, MAX_PAYMENTS), (window, count, allowed[window])
    if counter is not None:
        assert counter.count == allowed[counter.window_start]
    else:
        assert not allowed


def _check_sqlite_integrity(path: str) -> None:
    connection = sqlite3.connect(path)
    try:
        assert connection.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert connection.execute("PRAGMA foreign_key_check").fetchall() == []
    finally:
        connection.close()


def _check_postgres_indexes(engine: Engine) -> int:
    """amcheck on every B-tree index of the run's schema (with the heap: every row indexed),
    when PostgreSQL has the extension: created inside a transaction that is rolled back, so
    nothing is left installed in the shared database."""
    with engine.connect() as connection:
        available = connection.execute(
            text("SELECT 1 FROM pg_available_extensions WHERE name = 'amcheck'")
        ).first()
        if available is None:
            return 0
        try:
            schema = connection.execute(
                text(
                    "SELECT n.nspname FROM pg_extension e"
                    " JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'amcheck'"
                )
            ).scalar()
            if schema is None:
                connection.execute(text("CREATE EXTENSION amcheck"))
                schema = connection.execute(text("SELECT current_schema()")).scalar()
        except DBAPIError:  # not allowed to create it: nothing to check with
            connection.rollback()
            return 0
        indexes = connection.execute(
            text(
                "SELECT c.oid::regclass::text FROM pg_index i"
                " JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam"
                " WHERE c.relnamespace = current_schema()::regnamespace AND a.amname = 'btree'"
                # a partitioned table's index is a catalogue entry: its partitions' are checked
                " AND c.relkind = 'i'"
            )
        ).scalars()
        checked = 0
        for index in indexes:
            check = f'SELECT "{schema}".bt_index_check(CAST(:index AS regclass), true)'
            connection.execute(text(check), {"index": index})
            checked += 1
        assert checked > 0
        connection.rollback()
        return checked


def _check_served_audit_log(base: str, admin_key: str, agent_id: str, audited: set[str]) -> None:
    """The restarted server is ready and serves exactly the entries found in the database."""
    with httpx.Client(base_url=base, headers=bearer(admin_key), timeout=CALL_TIMEOUT) as http:
        assert http.get("/readyz").status_code == 200
        served: list[str] = []
        while True:
            query = {"agent_id": agent_id, "limit": 1000, "offset": len(served)}
            page = http.get("/v1/audit-logs", params=query)
            assert page.status_code == 200, page.text
            served += [entry["id"] for entry in page.json()["data"]]
            if len(served) >= page.json()["pagination"]["total"]:
                break
    assert len(served) == len(set(served))
    assert set(served) == audited
