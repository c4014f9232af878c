"""Tampering with the audit log as whoever holds the database would (the append-only guards taken
away first), each kind caught and named by ``agentauth audit verify`` (decisions §7): against the
database, and offline against a JSONL export of it. And an untouched log of 100,000 entries
verifies.

Each test has a database of its own (``fresh_database``), so the guards it drops are nobody
else's and nothing needs restoring. The arithmetic itself is tested in test_auditchain.py; here
it is the whole way round: decisions through the API, SQL on the real tables, the real command.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import delete, insert, select, text, update

from api import create_app
from core.config import Settings
from core.domain.auditchain import ZERO_HASH, chain_hash, entry_hash
from core.store import chain
from core.store.models import AuditEntry, AuditHead
from tests.api.helpers import record_audit_entries
from tests.audit_chain import AuditLog, Verdict, failed_at, fresh_database
from tests.conftest import FakeClock, Tenant

SIZE = 20  # entries in each test's log before it is tampered with
LOG = AuditEntry.__table__


@pytest.fixture
def log(tmp_path: Path, audit_key_file: str, clock: FakeClock) -> Iterator[AuditLog]:
    """A workspace with SIZE decisions, on a database of this test's own."""
    with fresh_database(tmp_path) as url:
        settings = Settings(
            database_url=url, rate_limit_per_minute=100_000, audit_key_file=audit_key_file
        )
        app = create_app(settings, clock=clock)
        try:
            audit_log = AuditLog(
                app, Tenant(app, f"tamper-{secrets.token_hex(4)}", clock), url, audit_key_file,
                tmp_path,
            )  # fmt: skip
            audit_log.decide(SIZE)
            yield audit_log
        finally:
            app.extensions["agentauth"].close()


def at(log: AuditLog, seq: int) -> Any:
    """The WHERE clause of the workspace's entry ``seq``."""
    return (AuditEntry.workspace_id == log.workspace.id) & (AuditEntry.seq == seq)


def line(log: AuditLog, seq: int) -> dict[str, Any]:
    [found] = log.export(seq_from=seq, seq_to=seq)
    return found


def both_fail_at(log: AuditLog, seq: int, what: str, *checkpoints: Path) -> None:
    """verify names ``seq`` and ``what``, exit 1, against the database and against an export."""
    on_db, on_export = log.verdicts(*checkpoints)
    assert failed_at(on_db, seq, what), on_db
    assert failed_at(on_export, seq, what), on_export


def both_pass(log: AuditLog, size: int, *checkpoints: Path) -> None:
    for verdict in log.verdicts(*checkpoints):
        assert verdict.code == 0, verdict
        assert (verdict.report["size"], verdict.report["checkpoints"]) == (size, len(checkpoints))


def renumber_from(session: Any, log: AuditLog, seq: int, by: int) -> None:
    """Every entry from ``seq`` on moved ``by`` places, in two steps so that the unique index on
    (workspace, seq) never sees two at once."""
    where = {"w": log.workspace.id, "s": seq}
    session.execute(
        text("UPDATE audit_log SET seq = -seq WHERE workspace_id = :w AND seq >= :s"), where
    )
    session.execute(
        text("UPDATE audit_log SET seq = :by - seq WHERE workspace_id = :w AND seq < 0"),
        {**where, "by": by},
    )


# ---------------------------------------------------------------------------- the baseline


def test_an_untouched_log_verifies_against_the_database_and_an_export(log):
    both_pass(log, SIZE)
    both_pass(log, SIZE, log.checkpoint_file())


# ---------------------------------------------------------------------------- changed


def test_a_changed_reason_is_named_changed_at_its_seq(log):
    with log.as_superuser() as session:
        session.execute(update(AuditEntry).where(at(log, 7)).values(reason="approved by the CFO"))
    assert line(log, 7)["reason"] == "approved by the CFO"  # the database took it
    both_fail_at(log, 7, "changed")


def test_changed_parameters_are_named_changed_at_their_seq(log):
    assert line(log, 12)["parameters"] == {"n": 11, "note": "call 11"}
    with log.as_superuser() as session:
        session.execute(
            update(AuditEntry).where(at(log, 12)).values(parameters={"n": 11, "note": "call 12"})
        )
    both_fail_at(log, 12, "changed")


def test_an_entry_changed_in_the_export_alone_is_named_changed(log):
    lines = log.export_body().decode().splitlines(keepends=True)
    lines[4] = lines[4].replace('"result":"allowed"', '"result":"denied"')
    assert '"result":"denied"' in lines[4]
    verdict = log.verify_export(export=log.file("log.jsonl", "".join(lines)))
    assert failed_at(verdict, 5, "changed"), verdict


def _with_would_be(log: AuditLog, calls: int) -> None:
    """The log's agent gets a shadow policy denying calendar.read (before its allow, by
    priority), then ``calls`` decisions: entries SIZE + 1 ... carry a would-be decision
    (decisions §10)."""
    body = {
        "agent_id": log.agent, "name": "shadow", "mode": "shadow", "priority": 10,
        "rules": [{"type": "tool_denylist", "tools": ["calendar.read"]}],
    }  # fmt: skip
    assert log.client.post("/v1/policies", json=body, headers=log.headers).status_code == 201
    log.decide(calls)


def test_a_changed_would_be_decision_is_named_changed_at_its_seq(log):
    _with_would_be(log, 3)
    tampered = SIZE + 2
    assert line(log, tampered)["wouldBe"]["result"] == "denied"
    both_pass(log, SIZE + 3)
    with log.as_superuser() as session:
        session.execute(update(AuditEntry).where(at(log, tampered)).values(would_result="allowed"))
    assert line(log, tampered)["wouldBe"]["result"] == "allowed"  # the database took it
    both_fail_at(log, tampered, "changed")


def test_a_would_be_decision_taken_off_an_entry_is_named_changed(log):
    _with_would_be(log, 2)
    with log.as_superuser() as session:
        session.execute(
            update(AuditEntry)
            .where(at(log, SIZE + 1))
            .values(would_result=None, would_policy_id=None, would_rule_index=None,
                    would_reason=None)
        )  # fmt: skip
    assert line(log, SIZE + 1)["wouldBe"] is None
    both_fail_at(log, SIZE + 1, "changed")


def test_an_entry_passed_off_as_one_of_the_first_hash_version_is_named_changed(log):
    """Entries before decisions §10 are hashed without ``wouldBe``: moving a newer one to
    version 1 (to hide its would-be decision from the hash) breaks the chain."""
    assert line(log, 5)["hashVersion"] == 2
    with log.as_superuser() as session:
        session.execute(update(AuditEntry).where(at(log, 5)).values(hash_version=1))
    both_fail_at(log, 5, "changed")


def test_a_would_be_decision_changed_in_the_export_alone_is_named_changed(log):
    _with_would_be(log, 2)
    lines = log.export_body().decode().splitlines(keepends=True)
    assert '"result":"denied"' in lines[SIZE]  # the would-be decision of entry SIZE + 1
    lines[SIZE] = lines[SIZE].replace('"wouldBe":{', '"wouldBe":{"note":"x",')
    verdict = log.verify_export(export=log.file("log.jsonl", "".join(lines)))
    assert failed_at(verdict, SIZE + 1, "changed"), verdict


# ---------------------------------------------------------------------------- missing


def test_a_deleted_middle_entry_is_named_missing_at_its_seq(log):
    with log.as_superuser() as session:
        session.execute(delete(AuditEntry).where(at(log, 10)))
    assert [entry["seq"] for entry in log.export(seq_from=9, seq_to=11)] == [9, 11]
    both_fail_at(log, 10, "missing")


def test_the_newest_entries_deleted_and_the_head_rewound_are_caught_only_by_a_checkpoint(log):
    earlier = log.checkpoint_file()  # taken before the deletion, kept elsewhere
    keep = SIZE - 10
    head = line(log, keep)["hash"]
    with log.as_superuser() as session:
        session.execute(
            delete(AuditEntry).where(
                (AuditEntry.workspace_id == log.workspace.id) & (AuditEntry.seq > keep)
            )
        )
        session.execute(
            update(AuditHead)
            .where(AuditHead.workspace_id == log.workspace.id)
            .values(seq=keep, hash=head)
        )
    both_pass(log, keep)  # self-consistent: without a checkpoint nothing can tell
    both_fail_at(log, keep + 1, "missing", earlier)


def test_the_newest_entries_deleted_without_the_head_are_named_missing_by_the_database(log):
    with log.as_superuser() as session:
        session.execute(
            delete(AuditEntry).where(
                (AuditEntry.workspace_id == log.workspace.id) & (AuditEntry.seq > SIZE - 10)
            )
        )
    verdict = log.verify_db()  # no checkpoint: the head row tells
    assert failed_at(verdict, SIZE - 9, "missing"), verdict
    assert f"its head is at {SIZE}" in verdict.report["failure"]["detail"]


# ---------------------------------------------------------------------------- inserted


def _planted(log: AuditLog, seq: int) -> dict[str, Any]:
    """An entry an attacker makes up to stand at ``seq``: a copy of the one there, another id,
    another reason, its own entry hash right."""
    with log.db.transaction() as session:
        row = dict(session.execute(select(LOG).where(at(log, seq))).mappings().one())
    row.update(id="01a21455-0000-7000-8000-0000000000aa", reason="approved by the CFO")
    own = entry_hash({**line(log, seq), "id": row["id"], "reason": row["reason"]})
    row["entry_hash"] = own.hex()
    return row


@pytest.mark.parametrize(
    "its_hash",
    [
        "copied",  # the hash of the entry whose place it takes
        "chained",  # the hash it would have had there: it chains from the entry before it
    ],
)
def test_an_inserted_entry_is_named_inserted_at_its_seq(log, its_hash):
    planted = _planted(log, 8)
    before = bytes.fromhex(line(log, 7)["hash"])
    planted["hash"] = (
        line(log, 8)["hash"]
        if its_hash == "copied"
        else chain_hash(before, bytes.fromhex(planted["entry_hash"])).hex()
    )
    with log.as_superuser() as session:
        renumber_from(session, log, 8, by=1)
        session.execute(insert(AuditEntry).values(planted))
        session.execute(
            update(AuditHead).where(AuditHead.workspace_id == log.workspace.id).values(seq=SIZE + 1)
        )
    assert line(log, 8)["reason"] == "approved by the CFO"
    both_fail_at(log, 8, "inserted")


def test_a_line_added_to_an_export_is_named_inserted(log):
    lines = log.export_body().decode().splitlines(keepends=True)
    lines.insert(6, lines[5])  # entry 6 twice
    verdict = log.verify_export(export=log.file("log.jsonl", "".join(lines)))
    assert failed_at(verdict, 6, "inserted"), verdict


# ---------------------------------------------------------------------------- reordered


@pytest.mark.parametrize(("first", "second"), [(8, 9), (8, 12)])
def test_two_entries_whose_seqs_were_swapped_are_named_reordered(log, first, second):
    """Each row keeps its content and hash; the two trade places in seq order."""
    with log.as_superuser() as session:
        swap = {"w": log.workspace.id, "a": first, "b": second}
        session.execute(
            text(
                "UPDATE audit_log SET seq = CASE seq WHEN :a THEN -:b ELSE -:a END"
                " WHERE workspace_id = :w AND seq IN (:a, :b)"
            ),
            swap,
        )
        session.execute(
            text("UPDATE audit_log SET seq = -seq WHERE workspace_id = :w AND seq < 0"), swap
        )
    assert line(log, first)["parameters"]["n"] == second - 1  # the later call now comes first
    both_fail_at(log, first, "reordered")


def test_two_entries_whose_contents_were_swapped_are_named_reordered(log):
    """The rows keep seq and hash; what they say (id, parameters, time...) trades places."""
    content = ["id", "parameters", "reason", "latency_ms", "timestamp"]
    with log.as_superuser() as session:
        columns = [LOG.c[name] for name in content]
        eight, nine = (
            dict(session.execute(select(*columns).where(at(log, seq))).one()._mapping)
            for seq in (8, 9)
        )
        session.execute(update(AuditEntry).where(at(log, 8)).values(id="swapping"))
        session.execute(update(AuditEntry).where(at(log, 9)).values(eight))
        session.execute(update(AuditEntry).where(at(log, 8)).values(nine))
    assert line(log, 8)["parameters"]["n"] == 8
    both_fail_at(log, 8, "reordered")


def test_two_lines_of_an_export_swapped_are_named_reordered(log):
    lines = log.export_body().decode().splitlines(keepends=True)
    lines[10], lines[11] = lines[11], lines[10]
    verdict = log.verify_export(export=log.file("log.jsonl", "".join(lines)))
    assert failed_at(verdict, 11, "reordered"), verdict


# ------------------------------------------------------------------- checkpoints and rebuilding


def _forged_signature(note: str) -> str:
    """``note`` with one bit of its signature (not of its key ID) flipped."""
    text_part, _, signature_line = note.rpartition("\n\n")
    prefix, _, encoded = signature_line.rstrip("\n").rpartition(" ")
    raw = bytearray(base64.b64decode(encoded))
    raw[10] ^= 0x01
    return f"{text_part}\n\n{prefix} {base64.b64encode(bytes(raw)).decode()}\n"


def _signed_by_another_key(note: str) -> str:
    from core.domain.auditchain import sign_note

    text_part = note.rpartition("\n\n")[0] + "\n"
    return sign_note(text_part, Ed25519PrivateKey.generate())


def _bigger(note: str) -> str:
    """The note claiming one entry more, its signature kept."""
    origin, size, rest = note.split("\n", 2)
    return f"{origin}\n{int(size) + 1}\n{rest}"


@pytest.mark.parametrize(
    "forge",
    [
        pytest.param(_forged_signature, id="signature-bit-flipped"),
        pytest.param(_signed_by_another_key, id="signed-by-another-key"),
        pytest.param(_bigger, id="size-changed-under-the-signature"),
    ],
)
def test_a_checkpoint_with_a_forged_signature_is_named_bad_signature(log, forge):
    genuine = log.checkpoint_file()
    note = genuine.read_text(encoding="utf-8")
    forged = log.file("checkpoints", note + forge(note))  # the genuine one first, then forged
    claimed = int(forge(note).split("\n")[1])
    both_pass(log, SIZE, genuine)
    both_fail_at(log, claimed, "bad signature", forged)


def test_a_log_rebuilt_wholesale_with_a_fresh_chain_is_caught_by_an_older_checkpoint(log):
    older = log.checkpoint_file()  # at SIZE
    log.decide(5)
    newer = log.checkpoint_file()  # at SIZE + 5
    lines = log.export()
    # every entry rewritten to taste, and a new chain over them from seq 1, head row included
    head = ZERO_HASH
    with log.as_superuser() as session:
        for entry in lines:
            entry["reason"] = "approved by the CFO"
            own = entry_hash(entry)
            head = chain_hash(head, own)
            session.execute(
                update(AuditEntry)
                .where(at(log, entry["seq"]))
                .values(reason=entry["reason"], entry_hash=own.hex(), hash=head.hex())
            )
        session.execute(
            update(AuditHead)
            .where(AuditHead.workspace_id == log.workspace.id)
            .values(hash=head.hex())
        )
    both_pass(log, SIZE + 5)  # self-consistent
    both_fail_at(log, SIZE, "head differs from checkpoint", older)
    both_fail_at(log, SIZE, "head differs from checkpoint", older, newer)
    both_fail_at(log, SIZE + 5, "head differs from checkpoint", newer)


# ---------------------------------------------------------------------- a long untouched log

LONG = 100_000
CHUNK = 4_000  # entries per recorder batch: one transaction, one executemany
VERIFY_SECONDS = 600  # a hang guard for verify's process, never a measure of speed


def test_an_untouched_log_of_100000_entries_verifies(tmp_path, audit_key_file, clock):
    """Written as decisions write them (the group-commit recorder extends the chain), in
    batches of CHUNK entries; verified against the database with a checkpoint of the end."""
    with fresh_database(tmp_path) as url:
        settings = Settings(
            database_url=url, rate_limit_per_minute=100_000, audit_key_file=audit_key_file
        )
        app = create_app(settings, clock=clock)
        try:
            tenant = Tenant(app, f"long-{secrets.token_hex(4)}", clock)
            tenant.key("read-only")  # makes the workspace
            agent_id = "6f1c1f0e-0000-4000-8000-000000000001"  # an agent that never existed
            for start in range(0, LONG, CHUNK):
                record_audit_entries(
                    app,
                    (
                        {
                            "workspace_id": tenant.id,
                            "agent_id": agent_id,
                            "agent_exists": False,
                            "key_id": None,
                            "tool_name": "calendar.read",
                            "parameters": {"n": n, "day": f"2026-11-{n % 28 + 1:02d}"},
                            "result": "denied",
                            "policy_id": None,
                            "rule_index": None,
                            "reason": "no policy",
                            "latency_ms": (n % 1000) / 7,
                            "timestamp": clock(),
                        }
                        for n in range(start, min(start + CHUNK, LONG))
                    ),
                )
            with app.extensions["agentauth"].db.transaction() as session:
                assert chain.head(session, tenant.id)[0] == LONG
            checkpoint = _checkpoint(tenant.name, url, audit_key_file, tmp_path)
        finally:
            app.extensions["agentauth"].close()
        verdict = _verify_in_a_process_of_its_own(
            audit_key_file, "--db", url, "--workspace", tenant.name, "--checkpoint", checkpoint
        )
    assert verdict.code == 0, verdict
    report = verdict.report
    assert (report["entries"], report["size"], report["erased"], report["checkpoints"]) == (
        LONG, LONG, 0, 1,
    )  # fmt: skip


def _verify_in_a_process_of_its_own(key_file: str, *args: Any) -> Verdict:
    """``agentauth audit verify ARGS --format json`` as a user runs it, in a process of its own
    (a log this long is hashed by worker processes, which such a process starts)."""
    env = {**os.environ, "AGENTAUTH_AUDIT_KEY_FILE": key_file}
    env.pop("AGENTAUTH_AUDIT_KEY", None)
    command = [sys.executable, "-m", "controller", "audit", "verify", *map(str, args)]
    done = subprocess.run(
        [*command, "--format", "json"],
        capture_output=True, text=True, env=env, timeout=VERIFY_SECONDS, check=False,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    return Verdict(done.returncode, json.loads(done.stdout))


def _checkpoint(workspace: str, url: str, key_file: str, folder: Path) -> Path:
    from tests.audit_chain import audit_cli

    path = folder / "long.checkpoints"
    result = audit_cli(key_file, "checkpoint", "--db", url, "--workspace", workspace, "--out", path)
    assert result.exit_code == 0, result.output
    return path
