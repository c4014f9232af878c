"""The verifiable audit log as its users meet it (decisions §7): entries with ``seq`` and
``hash``, the signed checkpoint and the public key, the JSONL export and its ``seq`` range;
deleting an agent erases its entries and keeps their places; the guards that leave erasure as
the one update; the chain under concurrent decisions (threads of one process, and two real
servers on one PostgreSQL); ``agentauth audit checkpoint`` and ``verify`` from the command line;
and a verifier of a third party's, written from the README alone, agreeing with ours.

Tampering with the database is tests/core/test_chain_tamper.py; the arithmetic is
tests/core/test_auditchain.py."""

from __future__ import annotations

import ast
import base64
import csv
import io
import json
import os
import random
import re
import stat
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import delete, update

import tests.independent_verifier as independent
from api import create_app
from core.config import Settings
from core.domain.auditchain import (
    Checkpoint,
    VerifierKey,
    origin_of,
    parse_note,
    split_notes,
    verify_note,
)
from core.domain.errors import StorageError
from core.store import audit, signing
from core.store import chain as store_chain
from core.store.models import AuditEntry, AuditHead
from tests.api.helpers import assert_error, decide, make_agent, record_audit_entries
from tests.audit_chain import ALLOW_CALENDAR, AuditLog, audit_cli, failed_at, jsonl
from tests.conftest import FakeClock, Tenant, bearer
from tests.server import running_server

HEX64 = frozenset("0123456789abcdef")
ERASED_MEMBERS = {"seq", "entryHash", "hash", "erased"}


@pytest.fixture
def log(app, workspace, settings, audit_key_file, tmp_path) -> AuditLog:
    """The test's workspace's log on the run's database, with one agent allowed calendar.*."""
    return AuditLog(app, workspace, settings.database_url, audit_key_file, tmp_path)


def listed(log: AuditLog, **query: Any) -> list[dict[str, Any]]:
    response = log.client.get(
        "/v1/audit-logs", query_string={"limit": 1000, **query}, headers=log.headers
    )
    assert response.status_code == 200, response.get_data(as_text=True)
    return list(response.json["data"])


def csv_rows(log: AuditLog) -> list[dict[str, str]]:
    response = log.client.get("/v1/audit-logs/export", headers=log.headers)
    assert response.status_code == 200
    return list(csv.DictReader(io.StringIO(response.get_data(as_text=True))))


def is_hash(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= HEX64


# ------------------------------------------------------------------ entries, checkpoint, key


def test_entries_from_the_api_carry_seq_1_to_n_and_a_hash(log):
    audit_ids = log.decide(6)
    entries = listed(log)  # newest first
    assert [entry["id"] for entry in entries] == audit_ids[::-1]
    assert [entry["seq"] for entry in entries] == [6, 5, 4, 3, 2, 1]
    assert all(is_hash(entry["hash"]) for entry in entries)
    assert len({entry["hash"] for entry in entries}) == 6
    # the export says the same of each
    exported = {line["id"]: (line["seq"], line["hash"]) for line in log.export()}
    assert exported == {entry["id"]: (entry["seq"], entry["hash"]) for entry in entries}


@pytest.mark.parametrize("scope", ["admin", "approver", "read-only"])
def test_the_checkpoint_verifies_with_the_public_key_for_any_scope(log, scope):
    log.decide(4)
    newest = log.export()[-1]
    headers = log.workspace.headers(scope)
    answer = log.client.get("/v1/audit-logs/checkpoint", headers=headers)
    key_answer = log.client.get("/v1/audit-logs/public-key", headers=headers)
    assert (answer.status_code, key_answer.status_code) == (200, 200)
    assert answer.mimetype == key_answer.mimetype == "text/plain"
    note = parse_note(answer.get_data(as_text=True))
    key = VerifierKey.parse(key_answer.get_data(as_text=True))
    assert key.name == "agentauth"
    assert verify_note(note, key)
    signed = Checkpoint.parse(note.text)
    assert signed.origin == f"agentauth/{log.workspace.id}" == origin_of(log.workspace.id)
    assert (signed.size, signed.head.hex()) == (4, newest["hash"])
    # and agentauth audit verify takes it, against the database and against an export
    note_file = log.file("checkpoint", answer.get_data(as_text=True))
    for verdict in log.verdicts(note_file):
        assert verdict.code == 0, verdict
        assert verdict.report["checkpoints"] == 1


def test_the_checkpoint_of_an_empty_log_is_size_0_and_32_zero_bytes(client, workspace):
    headers = workspace.headers("read-only")
    text = client.get("/v1/audit-logs/checkpoint", headers=headers).get_data(as_text=True)
    assert text.split("\n")[:3] == [
        f"agentauth/{workspace.id}",
        "0",
        base64.b64encode(bytes(32)).decode(),
    ]
    assert client.get("/v1/audit-logs/export?format=jsonl", headers=headers).get_data() == b""


@pytest.mark.parametrize("path", ["checkpoint", "public-key", "export?format=jsonl"])
def test_the_chain_s_endpoints_need_a_key(client, path):
    assert_error(client.get(f"/v1/audit-logs/{path}"), 401, "UNAUTHORIZED")


def test_a_checkpoint_is_of_the_caller_s_workspace_only(log, other_workspace):
    log.decide(3)
    theirs = other_workspace.headers("read-only")
    text = log.client.get("/v1/audit-logs/checkpoint", headers=theirs).get_data(as_text=True)
    assert text.split("\n")[:2] == [f"agentauth/{other_workspace.id}", "0"]
    assert log.client.get("/v1/audit-logs/export?format=jsonl", headers=theirs).get_data() == b""


# -------------------------------------------------------------------------- the JSONL export


def test_the_jsonl_export_holds_every_entry_in_seq_order_with_the_api_s_fields(log):
    log.decide(7)
    lines = log.export()
    assert [line["seq"] for line in lines] == list(range(1, 8))
    by_id = {entry["id"]: entry for entry in listed(log)}
    for line in lines:
        assert line == by_id[line["id"]]  # the API's rendering, seq and hash included


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        pytest.param({"seq_from": 3, "seq_to": 6}, [3, 4, 5, 6], id="from-to"),
        pytest.param({"seq_from": 4, "seq_to": 4}, [4], id="one"),
        pytest.param({"seq_from": 7}, [7, 8], id="from"),
        pytest.param({"seq_to": 2}, [1, 2], id="to"),
        pytest.param({"seq_from": 9}, [], id="past-the-end"),
        pytest.param({"seq_from": 5, "seq_to": 4}, [], id="empty-range"),
        pytest.param({"seq_to": 9_999_999_999}, list(range(1, 9)), id="ten-digits"),
    ],
)
def test_the_export_s_seq_range_is_inclusive(log, query, expected):
    log.decide(8)
    assert [line["seq"] for line in log.export(**query)] == expected


def test_filters_narrow_either_export_and_the_list_alike(log):
    """seq_from and seq_to narrow the CSV and the list too; content filters narrow the JSONL
    export (such an export is a query, no longer the whole chain)."""
    log.decide(3)
    log.decide(2, tool="shell.exec")  # denied
    log.decide(3)
    listed = log.client.get(
        "/v1/audit-logs", query_string={"seq_from": 3, "seq_to": 5}, headers=log.headers
    )
    assert listed.status_code == 200
    assert sorted(entry["seq"] for entry in listed.json["data"]) == [3, 4, 5]
    csv_rows = log.client.get(
        "/v1/audit-logs/export", query_string={"seq_from": 3, "seq_to": 5}, headers=log.headers
    )
    assert csv_rows.status_code == 200
    assert len(csv_rows.get_data(as_text=True).strip().splitlines()) == 1 + 3
    narrowed = log.export(result="denied")
    assert [line["seq"] for line in narrowed] == [4, 5]
    assert {line["toolName"] for line in narrowed} == {"shell.exec"}


@pytest.mark.parametrize(
    ("query", "field", "words"),
    [
        pytest.param({"format": "jsonl", "seq_from": "0"}, "seq_from", "from 1", id="zero"),
        pytest.param({"format": "jsonl", "seq_to": "-1"}, "seq_to", "whole number", id="negative"),
        pytest.param({"format": "jsonl", "seq_from": "abc"}, "seq_from", "whole number", id="abc"),
        pytest.param({"format": "jsonl", "seq_to": "1.5"}, "seq_to", "whole number", id="1.5"),
        pytest.param({"format": "jsonl", "seq_to": str(2**63)}, "seq_to", "at most", id="2**63"),
        pytest.param({"seq_to": "0"}, "seq_to", "from 1", id="csv-zero"),
        pytest.param({"format": "jsonl", "agent_id": "x"}, "agent_id", "UUID", id="agent_id"),
        pytest.param({"format": "xml"}, "format", "csv, jsonl or parquet", id="xml"),
        pytest.param({"format": "JSONL"}, "format", "csv, jsonl or parquet", id="JSONL"),
    ],
)
def test_a_bad_export_query_is_400_naming_the_parameter(log, query, field, words):
    response = log.client.get("/v1/audit-logs/export", query_string=query, headers=log.headers)
    error = assert_error(response, 400, "VALIDATION_ERROR")
    assert error["message"].startswith(f"{field}: ")
    assert words in error["message"]
    assert [detail["field"] for detail in error["details"]] == [field]


# ------------------------------------------------------------------------------- erasure


def test_deleting_an_agent_erases_its_entries_and_keeps_their_places_in_the_chain(log):
    other = make_agent(log.client, log.headers, "other", ALLOW_CALENDAR)
    doomed = [log.decide(1, agent=log.agent)[0]]
    kept = [log.decide(1, agent=other)[0]]
    doomed += log.decide(2, agent=log.agent)
    kept += log.decide(2, agent=other)
    doomed += log.decide(1, agent=log.agent)
    before = log.export()
    checkpoint = log.checkpoint_file()  # taken before the deletion: must still match

    response = log.client.delete(f"/v1/agents/{log.agent}", headers=log.headers)
    assert response.status_code == 204

    after = log.export()
    assert [line["seq"] for line in after] == list(range(1, 8))
    for old, new in zip(before, after, strict=True):
        if old["id"] in doomed:
            assert set(new) == ERASED_MEMBERS
            assert new["erased"] is True
            assert (new["seq"], new["hash"]) == (old["seq"], old["hash"])
            assert is_hash(new["entryHash"])
        else:
            assert new == old
    assert {entry["id"] for entry in listed(log)} == set(kept)
    assert listed(log, agent_id=log.agent) == []
    rows = csv_rows(log)
    assert len(rows) == len(kept)
    assert {row["Agent ID"] for row in rows} == {other}
    for verdict in log.verdicts(checkpoint):
        assert verdict.code == 0, verdict
        report = verdict.report
        assert (report["entries"], report["erased"], report["checkpoints"]) == (7, 4, 1)
    text = log.cli("verify", "--db", log.database_url, workspace=True)
    assert text.exit_code == 0
    assert "7 entries (4 erased)" in text.stdout


def test_the_chain_goes_on_after_an_erasure(log):
    log.decide(2)
    assert log.client.delete(f"/v1/agents/{log.agent}", headers=log.headers).status_code == 204
    other = make_agent(log.client, log.headers, "other", ALLOW_CALENDAR)
    log.decide(2, agent=other)
    assert [line["seq"] for line in log.export()] == [1, 2, 3, 4]
    assert [entry["seq"] for entry in listed(log)] == [4, 3]
    assert log.verify_db().report["erased"] == 2


def _erasing(**also: Any) -> dict[str, Any]:
    """What deleting an agent writes over an entry (audit.ERASED), and ``also``."""
    return {**audit.ERASED, **also}


def _entry_of(log: AuditLog, seq: int) -> Any:
    return (AuditEntry.workspace_id == log.workspace.id) & (AuditEntry.seq == seq)


#: updates the database refuses: everything but the one erasure deleting an agent makes
NOT_ERASURES = {
    "reason-changed": lambda log: (
        update(AuditEntry).where(_entry_of(log, 2)).values(reason="approved by the CFO")
    ),
    "erased-and-hash-changed": lambda log: (
        update(AuditEntry).where(_entry_of(log, 2)).values(_erasing(hash="0" * 64))
    ),
    "erased-and-entry-hash-changed": lambda log: (
        update(AuditEntry).where(_entry_of(log, 2)).values(_erasing(entry_hash="0" * 64))
    ),
    "erased-and-seq-changed": lambda log: (
        update(AuditEntry).where(_entry_of(log, 2)).values(_erasing(seq=99))
    ),
    "erased-and-timestamp-changed": lambda log: (
        update(AuditEntry)
        .where(_entry_of(log, 2))
        .values(_erasing(timestamp=log.workspace.clock.moment))
    ),
    "erased-and-id-changed": lambda log: (
        update(AuditEntry)
        .where(_entry_of(log, 2))
        .values(_erasing(id="01a21455-0000-7000-8000-0000000000ff"))
    ),
    "erased-entry-restored": lambda log: (
        update(AuditEntry)
        .where(_entry_of(log, 1))
        .values(erased=False, reason="approved by the CFO")
    ),
    "erased-entry-written-over": lambda log: (
        update(AuditEntry).where(_entry_of(log, 1)).values(reason="approved by the CFO")
    ),
    "erased-entry-deleted": lambda log: delete(AuditEntry).where(_entry_of(log, 1)),
    "entry-deleted": lambda log: delete(AuditEntry).where(_entry_of(log, 2)),
}


@pytest.mark.parametrize("statement", NOT_ERASURES.values(), ids=NOT_ERASURES.keys())
def test_the_database_refuses_any_change_but_an_erasure(log, statement):
    """Entry 1 is an erased one (its agent deleted), entry 2 a live one."""
    doomed = make_agent(log.client, log.headers, "doomed", ALLOW_CALENDAR)
    log.decide(1, agent=doomed)
    log.decide(1)
    assert log.client.delete(f"/v1/agents/{doomed}", headers=log.headers).status_code == 204
    before = log.export()
    with pytest.raises(StorageError), log.db.transaction(write=True) as session:
        session.execute(statement(log))
    assert log.export() == before
    assert log.verify_db().code == 0


def test_the_one_update_the_database_takes_is_the_erasure_of_an_agent_s_entry(log):
    """The same erasure deleting the agent makes, written by hand: the guard lets it through."""
    log.decide(1)
    with log.db.transaction(write=True) as session:
        session.execute(update(AuditEntry).where(_entry_of(log, 1)).values(audit.ERASED))
    assert set(log.export()[0]) == ERASED_MEMBERS
    assert log.verify_db().report["erased"] == 1


# --------------------------------------------------------------------------- concurrency

THREADS = 12
CALLS_PER_THREAD = 15


def test_many_threads_deciding_at_once_extend_each_chain_without_gap_or_repeat(
    app, log, other_workspace, settings, audit_key_file, tmp_path
):
    """Half the threads decide in one workspace, half in another, all at once."""
    theirs = AuditLog(app, other_workspace, settings.database_url, audit_key_file, tmp_path)
    logs = [log, theirs]
    start = threading.Barrier(THREADS)

    def calls(index: int) -> list[str]:
        target = logs[index % 2]
        client = app.test_client()  # a client of its own: test clients are not shared
        start.wait(timeout=60)
        return [
            decide(client, target.headers, target.agent, "calendar.read", thread=index, n=n)[
                "auditId"
            ]
            for n in range(CALLS_PER_THREAD)
        ]

    with ThreadPoolExecutor(THREADS) as pool:
        futures = [pool.submit(calls, index) for index in range(THREADS)]
        told = [future.result(timeout=300) for future in futures]

    per_log = THREADS // 2 * CALLS_PER_THREAD
    for index, each in enumerate(logs):
        lines = each.export()
        assert [line["seq"] for line in lines] == list(range(1, per_log + 1))
        assert {line["id"] for line in lines} == {
            audit_id for thread in range(index, THREADS, 2) for audit_id in told[thread]
        }
        verdict = each.verify_db(each.checkpoint_file())
        assert verdict.code == 0, verdict
        assert verdict.report["size"] == per_log


WORKSPACES = 4
RECORDERS = 2  # each with its own connection, as two processes have
BATCHES = 25  # per thread


def test_batches_of_several_processes_writing_to_several_workspaces_never_deadlock(
    app, settings, clock, tmp_path
):
    """Each batch writes to every workspace, its rows in an order of its own; two recorders
    (as two processes: their own connections, their own group commits) run such batches at
    once. Every batch commits, and each workspace's chain is whole. (Were the heads locked in
    the order of the rows, two batches would wait for each other in a circle: PostgreSQL
    breaks such a deadlock by failing one of them, and the decisions in it with a 500.)"""
    tenants = [Tenant(app, f"many-{os.urandom(4).hex()}-{n}", clock) for n in range(WORKSPACES)]
    for tenant in tenants:
        tenant.key("read-only")  # makes the workspace
    others = [create_app(settings, clock=clock) for _ in range(RECORDERS - 1)]
    recorders = [app, *others]
    start = threading.Barrier(RECORDERS * 2)

    def batches(index: int) -> None:
        order = random.Random(index)  # noqa: S311 (an order of rows, not a secret)
        start.wait(timeout=60)
        for _ in range(BATCHES):
            mine = order.sample(tenants, len(tenants))
            record_audit_entries(recorders[index % RECORDERS], (_row(t) for t in mine))

    try:
        with ThreadPoolExecutor(RECORDERS * 2) as pool:
            for future in [pool.submit(batches, index) for index in range(RECORDERS * 2)]:
                future.result(timeout=300)
    finally:
        for other in others:
            other.extensions["agentauth"].close()
    total = RECORDERS * 2 * BATCHES
    for tenant in tenants:
        log = AuditLog(app, tenant, settings.database_url, settings.audit_key_file, tmp_path)
        assert [line["seq"] for line in log.export()] == list(range(1, total + 1))
        assert log.verify_db().code == 0


def _row(tenant: Tenant) -> dict[str, Any]:
    return {
        "workspace_id": tenant.id,
        "agent_id": "6f1c1f0e-0000-4000-8000-000000000002",
        "agent_exists": False,
        "key_id": None,
        "tool_name": "calendar.read",
        "parameters": {},
        "result": "denied",
        "policy_id": None,
        "rule_index": None,
        "reason": "no policy",
        "latency_ms": 0.5,
        "timestamp": tenant.clock(),
    }


SERVER_CLIENTS = 8
SERVER_CALLS = 20  # per client
SERVER_SECONDS = 180  # a hang guard for the whole run of calls, never a measure of speed


@pytest.mark.slow
def test_two_servers_on_one_postgresql_extend_each_chain_without_a_fork(
    app, log, other_workspace, settings, tmp_path
):
    """Clients of two workspaces call two servers (two worker processes each) at once: each
    workspace's chain is one chain, seq 1..N with every decision in it, and verifies against
    the checkpoints both servers sign."""
    if settings.database_url.startswith("sqlite"):
        pytest.skip(
            "several servers share a database only on PostgreSQL (its head row is locked FOR"
            " UPDATE); the threads test covers one process on SQLite"
        )
    logs = [log, AuditLog(app, other_workspace, settings.database_url, log.key_file, tmp_path)]
    env = {
        "AGENTAUTH_AUDIT_KEY_FILE": log.key_file,  # the same key for both, as the README says
        "AGENTAUTH_RATE_LIMIT_PER_MINUTE": "100000",
    }
    # client i: workspace i % 2, server i // 2 % 2; a key each, so that no rate-limit counter
    # row makes every call wait for the one before
    keys = [logs[index % 2].workspace.key("admin") for index in range(SERVER_CLIENTS)]
    start = threading.Barrier(SERVER_CLIENTS)
    deadline = time.monotonic() + SERVER_SECONDS

    def calls(base: str, index: int) -> list[str]:
        body = {"agent_id": logs[index % 2].agent, "tool_name": "calendar.read"}
        made = []
        with httpx.Client(base_url=base, headers=bearer(keys[index]), timeout=60) as http:
            start.wait(timeout=60)
            for n in range(SERVER_CALLS):
                assert time.monotonic() < deadline, "the servers took too long"
                response = http.post("/v1/authorize", json={**body, "parameters": {"n": n}})
                assert response.status_code == 200, response.text
                made.append(response.json()["auditId"])
        return made

    with (
        running_server(log.database_url, workers=2, threads=4, env=env) as one,
        running_server(log.database_url, workers=2, threads=4, env=env) as two,
    ):
        servers = (one, two)
        with ThreadPoolExecutor(SERVER_CLIENTS) as pool:
            futures = [
                pool.submit(calls, servers[index // 2 % 2], index)
                for index in range(SERVER_CLIENTS)
            ]
            told = [future.result(timeout=300) for future in futures]
        notes = [
            [
                httpx.get(f"{base}/v1/audit-logs/checkpoint", headers=bearer(key), timeout=60).text
                for base in servers
            ]
            for key in keys[:2]  # a key of each workspace
        ]

    per_log = SERVER_CLIENTS // 2 * SERVER_CALLS
    for index, each in enumerate(logs):
        lines = each.export()
        assert [line["seq"] for line in lines] == list(range(1, per_log + 1))
        assert sorted(line["id"] for line in lines) == sorted(
            audit_id for client in told[index::2] for audit_id in client
        )
        first, second = notes[index]
        assert first == second  # one head, signed with the one key both servers were given
        verdict = each.verify_db(each.file("checkpoints", first + second))
        assert verdict.code == 0, verdict
        assert (verdict.report["size"], verdict.report["checkpoints"]) == (per_log, 2)
        with each.db.transaction() as session:
            head = session.get(AuditHead, each.workspace.id)
            assert head is not None
            assert (head.seq, head.hash) == (per_log, lines[-1]["hash"])


WALK_PAGES = 5  # pages of the walk, writes between each two


@pytest.mark.slow
def test_totals_stay_exact_and_a_walk_unchanged_while_two_worker_processes_write(log):
    """A cursor walk started before clients write through a server of two worker processes
    serves exactly the entries of its start, once each, whatever is committed between its
    pages; every total and the stats then count every decision both processes committed."""
    before = log.decide(4 * WALK_PAGES)
    env = {"AGENTAUTH_AUDIT_KEY_FILE": log.key_file, "AGENTAUTH_RATE_LIMIT_PER_MINUTE": "100000"}
    keys = [log.workspace.key("admin") for _ in range(SERVER_CLIENTS)]
    written = threading.Semaphore(0)  # released once a call is answered
    deadline = time.monotonic() + SERVER_SECONDS

    with running_server(log.database_url, workers=2, threads=4, env=env) as base:

        def calls(index: int) -> int:
            body = {"agent_id": log.agent, "tool_name": "calendar.read"}
            with httpx.Client(base_url=base, headers=bearer(keys[index]), timeout=60) as http:
                for n in range(SERVER_CALLS):
                    assert time.monotonic() < deadline, "the server took too long"
                    answer = http.post("/v1/authorize", json={**body, "parameters": {"n": n}})
                    assert answer.status_code == 200, answer.text
                    written.release()
            return SERVER_CALLS

        with (
            ThreadPoolExecutor(SERVER_CLIENTS) as pool,
            httpx.Client(base_url=base, headers=bearer(keys[0]), timeout=60) as reader,
        ):
            walked: list[str] = []
            query: dict[str, Any] = {"limit": 4}
            page = reader.get("/v1/audit-logs", params=query).json()
            futures = [pool.submit(calls, index) for index in range(SERVER_CLIENTS)]
            while True:
                walked += [entry["id"] for entry in page["data"]]
                following = page["pagination"]["nextCursor"]
                if following is None:
                    break
                for _ in range(3):  # three more decisions committed before the next page
                    assert written.acquire(timeout=SERVER_SECONDS), "no decision was written"
                page = reader.get("/v1/audit-logs", params={**query, "cursor": following}).json()
            made = sum(future.result(timeout=SERVER_SECONDS) for future in futures)
            everything = len(before) + made
            for params in ({}, {"tool_name": "calendar.read"}, {"agent_id": log.agent}):
                answer = reader.get("/v1/audit-logs", params={**params, "limit": 1}).json()
                assert answer["pagination"]["total"] == everything, params
            year = {"bucket": "day", "from": "2026-01-01T00:00:00Z", "to": "2027-12-31T00:00:00Z"}
            stats = reader.get("/v1/audit-logs/stats", params=year).json()  # the test's clock's
            assert sum(item["count"] for item in stats["data"]) == everything
    assert walked == list(reversed(before))
    assert len(log.export()) == everything


# ------------------------------------------------------------------------- the command line


def test_audit_checkpoint_appends_to_its_file_and_verify_takes_every_note_in_it(log):
    log.decide(3)
    path = log.folder / "checkpoints"
    first = log.cli("checkpoint", "--db", log.database_url, "--out", path, workspace=True)
    assert first.exit_code == 0, first.output
    assert f"at size 3 to {path}" in first.stderr
    log.decide(2)
    second = log.cli("checkpoint", "--db", log.database_url, "--out", path, workspace=True)
    assert second.exit_code == 0, second.output
    notes = split_notes(path.read_text(encoding="utf-8"))
    assert [Checkpoint.parse(parse_note(note).text).size for note in notes] == [3, 5]
    for verdict in log.verdicts(path):
        assert verdict.code == 0, verdict
        assert verdict.report["checkpoints"] == 2
    # without --out, the note is printed, the same as the API answers
    printed = log.cli("checkpoint", "--db", log.database_url, workspace=True)
    assert printed.exit_code == 0
    assert printed.stdout == log.checkpoint_note()


def test_verify_says_in_words_what_it_found(log):
    log.decide(4)
    ok = log.cli("verify", "--db", log.database_url, workspace=True)
    assert ok.exit_code == 0
    assert ok.stdout.startswith("ok: 4 entries (0 erased), head ")
    assert "no checkpoint given" in ok.stdout
    body = log.export_body().replace(b'"n":2', b'"n":20')
    failed = log.cli("verify", "--export", log.file("log.jsonl", body))
    assert failed.exit_code == 1
    assert failed.stdout.startswith("FAILED at seq 3: changed: ")


def test_verify_of_an_export_with_checkpoints_but_no_public_key_is_a_usage_error(log):
    log.decide(2)
    result = log.cli("verify", "--export", log.export_file(), "--checkpoint", log.checkpoint_file())
    assert result.exit_code == 2
    assert "--public-key" in result.stderr


@pytest.mark.parametrize(
    "flags",
    [
        pytest.param([], id="neither-db-nor-export"),
        pytest.param(["--db", "{db}", "--workspace", "{ws}", "--export", "{export}"], id="both"),
        pytest.param(["--db", "{db}"], id="db-without-workspace"),
    ],
)
def test_verify_needs_either_a_database_and_workspace_or_an_export(log, flags):
    values = {"db": log.database_url, "ws": log.workspace.name, "export": log.export_file()}
    result = log.cli("verify", *(flag.format(**values) for flag in flags))
    assert result.exit_code == 2
    assert "--export" in result.stderr or "--workspace" in result.stderr


@pytest.mark.parametrize("verb", ["checkpoint", "verify"])
def test_an_unknown_workspace_exits_2_naming_it(log, verb):
    result = log.cli(verb, "--db", log.database_url, "--workspace", "no-such-workspace")
    assert result.exit_code == 2
    assert "no workspace named 'no-such-workspace'" in result.stderr
    assert result.stdout == ""


def test_a_checkpoint_of_another_workspace_s_log_exits_2(log, other_workspace):
    log.decide(2)
    theirs = log.client.get(
        "/v1/audit-logs/checkpoint", headers=other_workspace.headers("read-only")
    ).get_data(as_text=True)
    result = log.cli(
        "verify", "--db", log.database_url, "--checkpoint", log.file("theirs", theirs),
        workspace=True,
    )  # fmt: skip
    assert result.exit_code == 2
    assert f"no checkpoint is of the log agentauth/{log.workspace.id}" in result.stderr
    assert f"they are of agentauth/{other_workspace.id}" in result.stderr


def test_a_file_of_every_workspace_s_checkpoints_verifies_each_log(log, other_workspace):
    """The file agentauth serve keeps (AGENTAUTH_CHECKPOINT_FILE) holds every workspace's
    notes: verify holds a log against its own, against the database or an export."""
    log.decide(3)
    theirs = log.client.get(
        "/v1/audit-logs/checkpoint", headers=other_workspace.headers("read-only")
    ).get_data(as_text=True)
    both = log.file("checkpoints", theirs + log.checkpoint_note() + theirs)
    result = log.cli("verify", "--db", log.database_url, "--checkpoint", both, workspace=True)
    assert result.exit_code == 0, result.output
    result = log.cli(
        "verify", "--export", log.export_file(), "--checkpoint", both,
        "--public-key", log.public_key_file(), "--workspace", log.workspace.name,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "3 entries" in result.stdout


def test_checkpoints_of_two_logs_given_with_an_export_exit_2(log, other_workspace):
    log.decide(2)
    theirs = log.client.get(
        "/v1/audit-logs/checkpoint", headers=other_workspace.headers("read-only")
    ).get_data(as_text=True)
    both = log.file("checkpoints", log.checkpoint_note() + theirs)
    result = log.cli(
        "verify", "--export", log.export_file(), "--checkpoint", both,
        "--public-key", log.public_key_file(),
    )  # fmt: skip
    assert result.exit_code == 2
    assert "several logs" in result.stderr
    assert "--workspace" in result.stderr


@pytest.mark.parametrize("missing", ["export", "checkpoint", "public-key"])
def test_a_file_verify_cannot_read_exits_2_naming_it(log, missing):
    log.decide(1)
    files = {
        "export": log.export_file(),
        "checkpoint": log.file("checkpoint", log.checkpoint_note()),
        "public-key": log.public_key_file(),
    }
    files[missing] = log.folder / "no-such-file"
    result = log.cli(
        "verify", *(part for name, path in files.items() for part in (f"--{name}", path))
    )
    assert result.exit_code == 2
    assert str(log.folder / "no-such-file") in result.stderr


def test_checkpoint_without_the_signing_key_exits_2_and_makes_none(log, tmp_path):
    absent = tmp_path / "elsewhere" / "audit.key"
    result = audit_cli(
        str(absent), "checkpoint", "--db", log.database_url, "--workspace", log.workspace.name
    )
    assert result.exit_code == 2
    assert f"no audit signing key at {absent}" in result.stderr
    assert not absent.exists()


def test_verify_of_a_database_that_is_not_there_exits_2_and_creates_nothing(log, tmp_path):
    missing = tmp_path / "no-such.db"
    result = log.cli("verify", "--db", f"sqlite:///{missing}", "--workspace", "default")
    assert result.exit_code == 2
    assert "does not exist" in result.stderr
    assert not missing.exists()


def test_checkpoint_into_a_folder_that_is_not_there_exits_2_naming_the_file(log, tmp_path):
    out = tmp_path / "no-such-folder" / "checkpoints"
    result = log.cli("checkpoint", "--db", log.database_url, "--out", out, workspace=True)
    assert result.exit_code == 2
    assert f"cannot write {out}" in result.stderr


# --------------------------------------------------------------------------- the signing key


def _public_key_of(settings: Settings) -> str:
    """What GET /v1/audit-logs/public-key answers an app of ``settings``."""
    app = create_app(settings)
    try:
        tenant = Tenant(app, f"key-{os.urandom(4).hex()}", FakeClock())
        response = app.test_client().get(
            "/v1/audit-logs/public-key", headers=tenant.headers("read-only")
        )
    finally:
        app.extensions["agentauth"].close()
    assert response.status_code == 200
    return str(response.get_data(as_text=True))


def test_the_signing_key_file_is_made_private_on_first_use_and_kept(settings, tmp_path):
    path = tmp_path / "keys" / "audit.key"
    given = replace(settings, audit_key_file=str(path))
    first = _public_key_of(given)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert _public_key_of(given) == first  # the next start finds the same key
    private = signing.parse_signer(path.read_text(encoding="ascii"))
    assert first == VerifierKey.of(private).text() + "\n"


def test_a_key_given_as_a_setting_signs_instead_of_a_file(settings, tmp_path):
    private = Ed25519PrivateKey.generate()
    path = tmp_path / "unused.key"
    given = replace(settings, audit_key_file=str(path), audit_key=signing.signer_text(private))
    assert _public_key_of(given) == VerifierKey.of(private).text() + "\n"
    assert not path.exists()


# ---------------------------------------------------------------- an independent verifier


def test_the_independent_verifier_imports_nothing_of_this_project():
    tree = ast.parse(Path(independent.__file__).read_text(encoding="utf-8"))
    imported = {
        (node.module if isinstance(node, ast.ImportFrom) else alias.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert imported == {"__future__", "base64", "hashlib", "json", "dataclasses", "rfc8785",
                        "cryptography"}  # fmt: skip


def _independent_world(log: AuditLog) -> tuple[str, str, str]:
    """A log with an erased entry or two, read as a third party reads it over HTTP: the JSONL
    export, a checkpoint, the public key."""
    doomed = make_agent(log.client, log.headers, "doomed", ALLOW_CALENDAR)
    log.decide(3)
    log.decide(2, agent=doomed)
    assert log.client.delete(f"/v1/agents/{doomed}", headers=log.headers).status_code == 204
    log.decide(3)
    key = log.client.get("/v1/audit-logs/public-key", headers=log.headers)
    return log.export_body().decode(), log.checkpoint_note(), key.get_data(as_text=True)


def test_an_independent_verifier_from_the_readme_agrees_on_an_untouched_log(log):
    export, note, public_key = _independent_world(log)
    theirs = independent.verify(export, [note], public_key)
    ours = log.verify_export(log.file("checkpoint", note), export=log.file("log.jsonl", export))
    assert theirs.ok
    assert ours.code == 0, ours
    assert (theirs.size, theirs.head.hex()) == (ours.report["size"], ours.report["head"]) == (
        8, jsonl(export.encode())[-1]["hash"],
    )  # fmt: skip
    assert ours.report["erased"] == 2


@pytest.mark.parametrize(
    ("tampering", "seq", "what"),
    [("entry-7-changed", 7, "changed"), ("newest-dropped", 8, "missing")],
)
def test_an_independent_verifier_from_the_readme_agrees_on_a_tampered_export(
    log, tampering, seq, what
):
    export, note, public_key = _independent_world(log)
    lines = export.splitlines(keepends=True)
    if tampering == "newest-dropped":
        del lines[-1]  # only the checkpoint can tell
    else:
        assert '"n":1,' in lines[6]
        lines[6] = lines[6].replace('"n":1,', '"n":7,')
    tampered = "".join(lines)
    theirs = independent.verify(tampered, [note], public_key)
    ours = log.verify_export(log.file("checkpoint", note), export=log.file("log.jsonl", tampered))
    assert failed_at(ours, seq, what), ours
    assert (theirs.ok, theirs.failed_at) == (False, seq)


def test_an_independent_verifier_from_the_readme_refuses_a_forged_checkpoint(log):
    export, note, public_key = _independent_world(log)
    forged = note.replace("\n8\n", "\n9\n")
    with pytest.raises(InvalidSignature):
        independent.verify(export, [forged], public_key)
    ours = log.verify_export(log.file("forged", forged), export=log.file("log.jsonl", export))
    assert failed_at(ours, 9, "bad signature"), ours


# ------------------------------------------------- values that need care in canonical JSON

CAREFUL_PARAMETERS = [
    {"whole": 3.0, "negative_zero": -0.0, "tiny": 1.5e-7, "third": 1 / 3},
    {"big": 2**60, "beyond_doubles": 2**70 + 1, "huge": 1e21, "e16": 1e16},
    {"ключ": "значение", "é": ["\u2028", "🙂", 'quote " and \\'], "a": {"b": [None, True]}},
    {"": "empty key", "nested": [[[]], {}, [{}]], "escapes": "\t\b\f\r\n\u001f"},
]


@pytest.mark.parametrize("parameters", CAREFUL_PARAMETERS)
def test_entries_with_parameters_that_need_care_in_canonical_json_verify(log, parameters):
    """The chain hashes what the decision wrote; verify hashes what the database gives back
    (PostgreSQL's JSONB rewrites numbers): the two must agree."""
    body = {"agent_id": log.agent, "tool_name": "calendar.read", "parameters": parameters}
    response = log.client.post("/v1/authorize", json=body, headers=log.headers)
    assert response.status_code == 200, response.get_data(as_text=True)
    log.decide(1)
    [entry] = listed(log, tool_name="calendar.read", result="allowed", limit=1, offset=1)
    assert log.export(seq_to=1) == [entry]  # the export writes what the API answers, exactly
    for verdict in log.verdicts(log.checkpoint_file()):
        assert verdict.code == 0, verdict
        assert verdict.report["size"] == 2


# ------------------------------------------------------------------ verifying a log in use


def test_verify_of_a_log_in_use_holds_to_the_log_as_it_was_when_it_started(log, monkeypatch):
    """Decisions go on while ``verify --db`` runs (here: right after it has read where the log
    ends, as its runs of entries are read on connections of their own); it verifies the log up
    to there and ends ok."""
    log.decide(30)
    monkeypatch.setattr(store_chain, "_RANGE", 8)
    reading = store_chain.parallel

    def decisions_meanwhile(*args: Any) -> Any:
        log.decide(3)
        yield from reading(*args)

    monkeypatch.setattr(store_chain, "parallel", decisions_meanwhile)
    verdict = log.verify_db()
    assert verdict.code == 0, verdict
    assert verdict.report["size"] == 30
    monkeypatch.undo()
    assert log.verify_db().report["size"] == 33


#: a process verifying twice: a short log read in the process itself, then the same log read by
#: worker processes (a log counts as long from PARALLEL_FROM entries, lowered here to 10, and
#: is read in runs of _RANGE entries, 3 here: several workers at once)
VERIFY_TWICE = """
import sys
from click.testing import CliRunner
from controller.cli import main
from core.store import chain
verify = ["audit", "verify", "--db", sys.argv[1], "--workspace", sys.argv[2], "--format", "json"]
codes = [CliRunner().invoke(main, verify).exit_code]
chain.PARALLEL_FROM, chain._RANGE = 10, 3
result = CliRunner().invoke(main, verify)
print(codes[0], result.exit_code, result.output)
"""


def test_a_process_that_verifies_twice_reads_the_second_log_with_workers_of_their_own(log):
    """Worker processes forked from a process that has read a log itself open connections
    of their own (using its connections, PostgreSQL's would break: exit 2)."""
    log.decide(30)
    done = subprocess.run(
        [sys.executable, "-c", VERIFY_TWICE, log.database_url, log.workspace.name],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "AGENTAUTH_AUDIT_KEY_FILE": log.key_file},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    first, second, report = done.stdout.split(" ", 2)
    assert (first, second) == ("0", "0"), report
    assert json.loads(report)["size"] == 30


def test_the_independent_verifier_runs_the_readme_s_code_as_it_stands():
    """The README's Python, past its imports, is word for word in the verifier: the recipe the
    tests run is the one readers copy."""
    readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    start = readme.index("```python\n", readme.index("In Python, with the `rfc8785`"))
    block = readme[start + len("```python\n") : readme.index("```\n", start + 10)]
    given = [line for line in block.splitlines() if not line.startswith(("import ", "from "))]
    verifier = Path(independent.__file__).read_text(encoding="utf-8")
    ours = "\n".join(re.sub(r"  # noqa: \w+$", "", line) for line in verifier.splitlines())
    assert "\n".join(given).strip() in ours


def test_a_checkpoint_of_the_empty_log_counts_and_is_held_against_hash_zero(log):
    """The first checkpoint a cron job takes may be of a log with no entry yet: it is matched
    (size 0, head hash(0)), and a note of size 0 signing another head is named, signed or not
    by the service's own key."""
    from core.config import Settings
    from core.domain.auditchain import Checkpoint, origin_of, sign_note
    from core.store.signing import load_or_create

    empty = log.checkpoint_file()
    log.decide(3)
    for verdict in log.verdicts(empty):
        assert verdict.code == 0, verdict.report
        assert verdict.report["checkpoints"] == 1
    key = load_or_create(Settings(audit_key_file=log.key_file), create=False)
    lying = Checkpoint(origin_of(log.workspace.id), 0, b"\x01" * 32)
    forged = log.file("lying", sign_note(lying.text(), key))
    for verdict in log.verdicts(forged):
        assert failed_at(verdict, 0, "head differs from checkpoint"), verdict.report
