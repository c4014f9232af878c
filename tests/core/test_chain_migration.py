"""Migration 0004 chains a log written before the chain existed (decisions §7): each workspace's
entries get seq 1, 2, 3, ... in timestamp-then-id order (whatever order they were inserted in,
and across the migration's pages of 2,000), their hashes, and a head row; the result verifies,
and the service then extends the same chains and erases their entries like any other."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from api import create_app
from core.config import Settings
from core.domain import ids
from core.store.database import Database
from core.store.migrate import current_revision, head_revision, upgrade
from core.store.models import AuditEntry, AuditHead, Workspace
from tests.api.helpers import decide, make_agent
from tests.audit_chain import ALLOW_CALENDAR, fresh_database, verify
from tests.conftest import FakeClock, Tenant

BUSY, QUIET, EMPTY = "busy-before-the-chain", "quiet-before-the-chain", "empty-before-the-chain"
BUSY_ENTRIES = 2300  # more than one page of the migration's backfill (2,000)
QUIET_ENTRIES = 40
ERASABLE = 25  # of the busy workspace's entries, those of an agent deleted after the upgrade
START = datetime(2026, 3, 1, 9, 0, 0, 123456)  # naive UTC, as the columns hold it
#: what pre-chain decisions were asked to do: values that need care in canonical JSON included
PARAMETERS: list[dict[str, Any]] = [
    {},
    {"amount": 12.5, "currency": "EUR"},
    {"nested": {"list": [1, 2.25, None, True, "x"], "ключ": "значение"}, "b": False},
    {"whole": 3.0, "tiny": 1.5e-7, "negative": -0.0},
    {"big": 2**60, "huge": 1e21, "exact": 9007199254740991},
    {"text": 'quote " backslash \\ tab \t emoji 🙂 and \u2028'},
]


def _old_log(rng: random.Random, agent: str) -> list[dict[str, Any]]:
    """Rows as agentauth wrote them before 0004: many sharing a timestamp (so the id decides),
    the quiet workspace's interleaved with the busy one's, in no order of id or time."""
    rows = []
    for workspace, count in ((BUSY, BUSY_ENTRIES), (QUIET, QUIET_ENTRIES)):
        for n in range(count):
            moment = START + timedelta(milliseconds=rng.randrange(count // 3))
            mine = workspace == BUSY and n < ERASABLE
            rows.append(
                {
                    "id": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                    "workspace_id": ids.workspace_id(workspace),
                    "agent_id": agent if mine else str(uuid.UUID(int=rng.getrandbits(128))),
                    "agent_ref": agent if mine else None,
                    "key_id": None,
                    "action": "authorize" if n % 5 else "approval.approve",
                    "tool_name": f"calendar.op{n % 7}",
                    "parameters": PARAMETERS[n % len(PARAMETERS)],
                    "result": ("allowed", "denied", "escalated")[n % 3],
                    "policy_id": str(uuid.UUID(int=n, version=4)) if n % 2 else None,
                    "rule_index": n % 4 if n % 2 else None,
                    "reason": f"reason {n} in {workspace}",
                    "latency_ms": rng.choice([0.0, 0.125, 1 / 3, 12.0, 250.75]),
                    "timestamp": moment,
                    "approval_id": str(uuid.UUID(int=n + 1, version=4)) if n % 3 == 2 else None,
                }
            )
    rng.shuffle(rows)
    return rows


def _write_at_0003(db: Database, rows: list[dict[str, Any]], agent: str) -> None:
    with db.engine.begin() as conn:
        tables = sa.MetaData()
        tables.reflect(conn, only=["workspaces", "agents", "audit_log"])
        assert "seq" not in tables.tables["audit_log"].c  # revision 0003 indeed
        conn.execute(
            tables.tables["workspaces"].insert(),
            [
                {"id": ids.workspace_id(name), "name": name, "created_at": START}
                for name in (BUSY, QUIET, EMPTY)
            ],
        )
        conn.execute(
            tables.tables["agents"].insert(),
            {
                "id": agent,
                "workspace_id": ids.workspace_id(BUSY),
                "name": "old-agent",
                "status": "active",
                "policy_version": 0,
                "created_at": START,
                "updated_at": START,
            },
        )
        conn.execute(tables.tables["audit_log"].insert(), rows)


def test_a_log_written_before_the_chain_is_chained_in_timestamp_then_id_order(
    tmp_path: Path, audit_key_file: str
):
    rng = random.Random(20261125)  # noqa: S311 (test data, the same each run)
    agent = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    rows = _old_log(rng, agent)
    with fresh_database(tmp_path, revision="0003") as url:
        settings = Settings(
            database_url=url, rate_limit_per_minute=100_000, audit_key_file=audit_key_file
        )
        db = Database(settings)
        try:
            assert current_revision(db) == "0003"
            _write_at_0003(db, rows, agent)
            upgrade(db)
            assert current_revision(db) == head_revision()
            with db.transaction() as session:
                chained = session.execute(
                    sa.select(
                        AuditEntry.workspace_id, AuditEntry.id, AuditEntry.seq, AuditEntry.hash
                    ).order_by(AuditEntry.workspace_id, AuditEntry.seq)
                ).all()
                workspaces = session.scalars(sa.select(Workspace.id)).all()
                heads = {
                    h.workspace_id: (h.seq, h.hash) for h in session.scalars(sa.select(AuditHead))
                }
        finally:
            db.dispose()

        # every workspace has its head, "default" and the one without entries at the start
        assert ids.workspace_id(EMPTY) in workspaces
        expected_heads = {wid: (0, "0" * 64) for wid in workspaces}
        for name in (BUSY, QUIET):
            wid = ids.workspace_id(name)
            mine = [row for row in chained if row.workspace_id == wid]
            oldest_first = sorted(
                (row for row in rows if row["workspace_id"] == wid),
                key=lambda row: (row["timestamp"], row["id"]),
            )
            assert [row.id for row in mine] == [row["id"] for row in oldest_first]
            assert [row.seq for row in mine] == list(range(1, len(oldest_first) + 1))
            expected_heads[wid] = (len(mine), mine[-1].hash)
            verdict = verify(audit_key_file, "--db", url, "--workspace", name)
            assert verdict.code == 0, verdict
            assert verdict.report["entries"] == len(oldest_first)
        assert heads == expected_heads

        _the_service_goes_on_with_the_migrated_chains(settings, agent, tmp_path, audit_key_file)


def _the_service_goes_on_with_the_migrated_chains(
    settings: Settings, old_agent: str, folder: Path, key_file: str
) -> None:
    """Decisions extend the migrated chain from its head; deleting the agent of migrated
    entries erases them; the chain verifies, with a checkpoint taken before the erasure."""
    clock = FakeClock(moment=datetime(2026, 11, 21, 12, 0, tzinfo=UTC))
    app = create_app(settings, clock=clock)
    try:
        app.extensions["agentauth"].audit_key()  # made on first use, as serve does at start
        client = app.test_client()
        busy = Tenant(app, BUSY, clock)
        headers = busy.headers("admin")
        listed = client.get("/v1/audit-logs?limit=1", headers=headers).json["data"]
        assert listed[0]["seq"] == BUSY_ENTRIES  # the newest migrated entry, by time
        agent = make_agent(client, headers, "new-agent", ALLOW_CALENDAR)
        audit_id = decide(client, headers, agent, "calendar.read")["auditId"]
        export = client.get(
            f"/v1/audit-logs/export?format=jsonl&seq_from={BUSY_ENTRIES + 1}", headers=headers
        ).get_json(force=True)
        assert (export["id"], export["seq"]) == (audit_id, BUSY_ENTRIES + 1)
        # the migrated entries keep the first field set; those written now carry the second
        # (decisions §10), and the chain goes on across the two
        assert (export["hashVersion"], export["wouldBe"]) == (2, None)
        oldest = client.get(
            "/v1/audit-logs/export?format=jsonl&seq_from=1&seq_to=1", headers=headers
        ).get_json(force=True)
        assert (oldest["hashVersion"], oldest["wouldBe"]) == (1, None)
        checkpoint = client.get("/v1/audit-logs/checkpoint", headers=headers)
        checkpoints = folder / "busy.checkpoints"
        checkpoints.write_text(checkpoint.get_data(as_text=True), encoding="utf-8")
        deleted = client.delete(f"/v1/agents/{old_agent}", headers=headers)
        assert deleted.status_code == 204
    finally:
        app.extensions["agentauth"].close()
    verdict = verify(
        key_file, "--db", settings.database_url, "--workspace", BUSY, "--checkpoint", checkpoints
    )
    assert verdict.code == 0, verdict
    report = verdict.report
    assert (report["entries"], report["erased"], report["checkpoints"]) == (
        BUSY_ENTRIES + 1, ERASABLE, 1,
    )  # fmt: skip
