"""``GET /v1/audit-logs/retention`` (decisions §9): what the log keeps, as the dashboard's
retention panel shows it: the entries kept, the whole log's size, how far it was pruned, the
oldest entry kept and the last prune with its archive file. After real prunes (``agentauth
audit prune``), on SQLite and on PostgreSQL."""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from core.domain.clock import isoformat
from core.store import retention
from tests.api.helpers import aged_entries, record_audit_entries
from tests.api.test_audit_chain import listed
from tests.audit_chain import AuditLog, audit_log_of_its_own
from tests.conftest import FakeClock, Tenant

NEVER_PRUNED = {"kept": 0, "size": 0, "prunedThrough": 0, "oldest": None, "lastPrune": None}


@pytest.fixture
def log(tmp_path: Path, audit_key_file: str, clock: FakeClock) -> Iterator[AuditLog]:
    """A workspace's log on a database of this test's own, with one agent allowed calendar.*."""
    with audit_log_of_its_own(tmp_path, audit_key_file, clock, "kept") as found:
        yield found


def retained(log: AuditLog, headers: dict[str, str] | None = None) -> Any:
    response = log.client.get("/v1/audit-logs/retention", headers=headers or log.headers)
    assert response.status_code == 200, response.get_data(as_text=True)
    return response.json


def prune_before(log: AuditLog, clock: FakeClock, folder: Path) -> None:
    """``agentauth audit prune`` of everything written so far; the clock then moves on."""
    cut = isoformat(clock.moment + timedelta(seconds=1))
    clock.advance(3600)
    result = log.cli(
        "prune", "--db", log.database_url, "--before", cut, "--archive", folder, workspace=True
    )
    assert result.exit_code == 0, result.output


def test_an_empty_log_keeps_nothing_and_was_never_pruned(log):
    assert retained(log) == NEVER_PRUNED


def test_before_any_prune_every_entry_is_kept_from_the_first(log):
    log.decide(4)
    first = listed(log)[-1]
    assert retained(log) == {
        "kept": 4,
        "size": 4,
        "prunedThrough": 0,
        "oldest": {"seq": 1, "timestamp": first["timestamp"]},
        "lastPrune": None,
    }


def test_after_a_prune_it_names_the_range_the_archive_and_the_oldest_kept(log, clock, tmp_path):
    folder = tmp_path / "archive"
    log.decide(5)
    prune_before(log, clock, folder)
    log.decide(3)
    entries = listed(log)
    prune_entry = next(e for e in entries if e["action"] == "audit.prune")
    archive = f"{log.workspace.name}-1-5.jsonl.gz"
    assert (folder / archive).is_file()
    answer = retained(log)
    assert answer == {
        "kept": 4,  # the prune's own entry and three decisions
        "size": 9,
        "prunedThrough": 5,
        "oldest": {"seq": 6, "timestamp": prune_entry["timestamp"]},
        "lastPrune": {
            "seq": 6,
            "at": prune_entry["timestamp"],
            "first": 1,
            "last": 5,
            "archive": archive,
            "reason": prune_entry["reason"],
        },
    }
    assert archive in answer["lastPrune"]["reason"]
    # the same count as the list's total, and the checkpoint's size
    total = log.client.get("/v1/audit-logs", headers=log.headers).json["pagination"]["total"]
    assert answer["kept"] == total == len(entries)
    assert log.checkpoint_note().split("\n")[1] == "9"


def test_a_second_prune_is_the_last_one_and_takes_the_first_ones_entry(log, clock, tmp_path):
    folder = tmp_path / "archive"
    log.decide(2)
    prune_before(log, clock, folder)  # 1-2, its entry is 3
    log.decide(2)  # 4, 5
    prune_before(log, clock, folder)  # 3-5, its entry is 6
    log.decide(1)  # 7
    answer = retained(log)
    assert answer["kept"] == 2
    assert answer["size"] == 7
    assert answer["prunedThrough"] == 5
    assert answer["oldest"]["seq"] == 6
    last = answer["lastPrune"]
    assert (last["seq"], last["first"], last["last"]) == (6, 3, 5)
    assert last["archive"] == f"{log.workspace.name}-3-5.jsonl.gz"
    assert (folder / last["archive"]).is_file()


def test_an_agents_call_of_a_tool_named_audit_prune_is_not_a_prune(log, clock, tmp_path):
    log.decide(1)
    prune_before(log, clock, tmp_path / "archive")  # 1, its entry is 2
    # the prune's entry has the time of the command line's (real) clock: the call after it
    clock.moment = datetime.now(UTC) + timedelta(days=1)
    log.decide(1, tool="audit.prune")  # denied: the agent may call calendar.* only
    spoof = [e for e in listed(log) if e["toolName"] == "audit.prune" and e["seq"] == 3]
    assert [(e["action"], e["result"]) for e in spoof] == [("authorize", "denied")]
    assert retained(log)["lastPrune"]["seq"] == 2


def test_erased_entries_are_not_kept_but_keep_their_place(log, clock, tmp_path):
    other = log.client.post(
        "/v1/agents", json={"name": "short-lived"}, headers=log.headers
    ).json["id"]  # fmt: skip
    log.decide(2, agent=other)  # 1, 2
    log.decide(1)  # 3
    assert retained(log)["kept"] == 3
    assert log.client.delete(f"/v1/agents/{other}", headers=log.headers).status_code == 204
    answer = retained(log)
    assert answer["kept"] == 1
    assert answer["size"] == 3
    assert answer["oldest"]["seq"] == 1  # erased, its place in the chain kept


def test_any_key_reads_it_and_only_its_own_workspaces(log, clock, tmp_path):
    log.decide(1)
    prune_before(log, clock, tmp_path / "archive")
    other = Tenant(log.app, f"other-{secrets.token_hex(4)}", clock)
    assert retained(log, other.headers("read-only")) == NEVER_PRUNED
    assert retained(log, log.workspace.headers("read-only"))["prunedThrough"] == 1


def test_a_query_parameter_is_refused_and_changes_nothing(log):
    log.decide(1)
    response = log.client.get(
        "/v1/audit-logs/retention", query_string={"limit": 5}, headers=log.headers
    )
    assert response.status_code == 400
    assert response.json["error"]["code"] == "VALIDATION_ERROR"
    assert "limit" in response.get_data(as_text=True)
    assert retained(log)["kept"] == 1


def plan_lines(connection: Any, statement: str, parameters: Any, sqlite: bool) -> list[str]:
    """How the database would run ``statement``: SQLite's query plan, or PostgreSQL's with
    sequential scans priced out (on a table this small it would otherwise prefer one)."""
    if sqlite:
        rows = connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters)
        return [str(row[-1]) for row in rows]
    connection.exec_driver_sql("SET LOCAL enable_seqscan = off")
    return [str(row[0]) for row in connection.exec_driver_sql(f"EXPLAIN {statement}", parameters)]


def test_its_reads_of_the_entries_are_index_lookups(log, clock, tmp_path):
    log.decide(3)
    prune_before(log, clock, tmp_path / "archive")
    log.decide(2)
    engine = log.db.engine
    seen: list[tuple[str, Any]] = []

    def note(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if "audit_log" in statement:
            seen.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", note)
    try:
        with log.db.transaction(snapshot=True) as session:
            found = retention.kept(session, log.workspace.id)
    finally:
        event.remove(engine, "before_cursor_execute", note)
    assert found.oldest is not None
    assert found.last_prune is not None
    assert (found.oldest[0], found.last_prune.last) == (4, 3)
    assert len(seen) >= 2  # the oldest kept and the last prune
    with engine.connect() as connection:
        for statement, parameters in seen:
            plan = plan_lines(connection, statement, parameters, log.db.is_sqlite)
            if log.db.is_sqlite:
                scans = [line for line in plan if line.startswith("SCAN audit_log")]
                sorts = [line for line in plan if "TEMP B-TREE" in line]
            else:
                scans = [line for line in plan if "Seq Scan on audit_log" in line]
                # a Sort node (a Merge Append's "Sort Key" merges ordered index scans)
                sorts = [line for line in plan if re.match(r"Sort\s+\(", line.lstrip(" ->"))]
            assert (scans, sorts) == ([], []), (statement, plan)
        connection.rollback()


def test_a_sessions_page_reads_the_session_index(log, clock):
    """The session index holds only the entries that have a session (migration 0008); a page
    of one session still walks it, never the whole log."""
    entries = aged_entries(log.workspace.id, 0, 6, clock.moment)
    for n, fields in enumerate(entries):
        fields["session_id"] = "s-1" if n % 2 else None
    record_audit_entries(log.app, entries)
    engine = log.db.engine
    seen: list[tuple[str, Any]] = []

    def note(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if "audit_log" in statement and "session_id" in statement:
            seen.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", note)
    try:
        response = log.client.get("/v1/audit-logs?session_id=s-1", headers=log.headers)
    finally:
        event.remove(engine, "before_cursor_execute", note)
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.json["pagination"]["total"] == 3
    assert [e["sessionId"] for e in response.json["data"]] == ["s-1"] * 3
    walks = [s for s in seen if "ORDER BY" in s[0]]
    assert walks, seen
    with engine.connect() as connection:
        for statement, parameters in walks:
            plan = " ".join(plan_lines(connection, statement, parameters, log.db.is_sqlite))
            # PostgreSQL names each partition's index after its columns
            index = "session_id_timestamp"
            if log.db.is_sqlite:
                index = "ix_audit_workspace_session_time"
            assert index in plan, (statement, plan)
            assert "SCAN audit_log " not in plan + " ", (statement, plan)
        connection.rollback()
