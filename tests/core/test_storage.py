"""The storage promises: the audit log is append-only in the database itself, except for the
erasure that comes with deleting the entry's agent; counters are exact."""

from __future__ import annotations

import sqlite3
import threading
import time
from datetime import UTC, datetime

import pytest
from sqlalchemy import delete, func, select, text, update

from core.config import Settings
from core.domain import ids
from core.domain.errors import StorageError
from core.hotpath.recorder import Recorder
from core.store import agents, audit, limits
from core.store import database as database_module
from core.store.database import Database
from core.store.keys import ensure_workspace
from core.store.models import AuditEntry, Policy
from core.store.policies import create_policy

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


@pytest.fixture
def db(database_url):
    database = Database(Settings(database_url=database_url))
    yield database
    database.dispose()


@pytest.fixture
def world(db):
    """A workspace with one agent, one policy and two audit entries for it, plus one entry for
    an agent id that never existed."""
    with db.transaction(write=True) as s:
        wid = ensure_workspace(s, f"storage-{ids.new_id()}", NOW)
        agent = agents.create_agent(s, wid, {"name": "a"}, NOW)
        policy = create_policy(
            s, wid, {"agent_id": agent.id, "name": "p", "rules": [{"type": "tool_allowlist"}]}, NOW
        )
    ghost = ids.new_id()
    rows = [
        _entry(wid, agent_id, exists)
        for agent_id, exists in ((agent.id, True), (agent.id, True), (ghost, False))
    ]
    recorder = Recorder.for_database(db)  # written as decisions write them: chained
    try:
        recorder.run(lambda batch: [batch.append_audit(row) for row in rows])
    finally:
        recorder.close()
    return {"workspace": wid, "agent": agent.id, "policy": policy.id, "ghost": ghost}


def _entry(wid: str, agent_id: str, exists: bool) -> dict:
    return audit.entry(
        workspace_id=wid,
        agent_id=agent_id,
        agent_exists=exists,
        key_id=None,
        tool_name="t",
        parameters={},
        result="denied",
        policy_id=None,
        rule_index=None,
        reason="default deny",
        latency_ms=0.1,
        timestamp=NOW,
    )


def _count(db, **where):
    with db.transaction() as s:
        query = select(func.count()).select_from(AuditEntry)
        for column, value in where.items():
            query = query.where(getattr(AuditEntry, column) == value)
        return s.scalar(query)


TAMPERING = {
    "orm-update": lambda s, w: s.execute(
        update(AuditEntry).where(AuditEntry.agent_id == w["agent"]).values(result="allowed")
    ),
    "orm-delete": lambda s, w: s.execute(
        delete(AuditEntry).where(AuditEntry.agent_id == w["agent"])
    ),
    "orm-delete-unknown-agent": lambda s, w: s.execute(
        delete(AuditEntry).where(AuditEntry.agent_id == w["ghost"])
    ),
    "raw-update": lambda s, w: s.execute(
        text("UPDATE audit_log SET reason = 'x' WHERE workspace_id = :w"), {"w": w["workspace"]}
    ),
    "raw-delete": lambda s, w: s.execute(
        text("DELETE FROM audit_log WHERE workspace_id = :w"), {"w": w["workspace"]}
    ),
    "raw-detach-then-delete": lambda s, w: s.execute(
        text("UPDATE audit_log SET agent_ref = NULL WHERE agent_id = :a"), {"a": w["agent"]}
    ),
    # erasing, but moving the entry in the chain too
    "erase-and-move": lambda s, w: s.execute(
        update(AuditEntry)
        .where(AuditEntry.agent_id == w["agent"])
        .values({**audit.ERASED, "seq": AuditEntry.seq + 10})
    ),
    # erasing an entry whose agent never existed (no agent is being deleted)
    "erase-unknown-agent": lambda s, w: s.execute(
        update(AuditEntry).where(AuditEntry.agent_id == w["ghost"]).values(audit.ERASED)
    ),
    # "erasing" while keeping the content
    "erase-keep-reason": lambda s, w: s.execute(
        update(AuditEntry)
        .where(AuditEntry.agent_id == w["agent"])
        .values({**audit.ERASED, "reason": "kept"})
    ),
}


@pytest.mark.parametrize("tamper", TAMPERING.values(), ids=TAMPERING.keys())
def test_audit_rows_cannot_be_changed_or_deleted(db, world, tamper):
    with pytest.raises(StorageError), db.transaction(write=True) as s:
        tamper(s, world)
    assert _count(db, workspace_id=world["workspace"]) == 3
    assert _count(db, workspace_id=world["workspace"], result="allowed") == 0


def test_audit_table_cannot_be_truncated_on_postgresql(db, world):
    if db.is_sqlite:
        pytest.skip("SQLite has no TRUNCATE statement")
    with pytest.raises(StorageError), db.transaction(write=True) as s:
        s.execute(text("TRUNCATE audit_log"))
    assert _count(db, workspace_id=world["workspace"]) == 3


def test_deleting_the_agent_erases_its_entries_and_deletes_its_policies_only(db, world):
    with db.transaction(write=True) as s:
        before = {
            e.seq: (e.entry_hash, e.hash)
            for e in s.scalars(
                select(AuditEntry).where(AuditEntry.workspace_id == world["workspace"])
            )
        }
        agents.delete_agent(s, world["workspace"], world["agent"])
    assert _count(db, agent_id=world["agent"]) == 0
    assert _count(db, agent_id=world["ghost"]) == 1
    assert _count(db, workspace_id=world["workspace"], erased=True) == 2
    with db.transaction() as s:
        assert s.get(Policy, world["policy"]) is None
        after = {
            e.seq: (e.entry_hash, e.hash)
            for e in s.scalars(
                select(AuditEntry).where(AuditEntry.workspace_id == world["workspace"])
            )
        }
    assert after == before  # each keeps its place in the chain


def test_counter_allows_exactly_the_maximum_then_resets_in_a_new_window(db):
    name = f"test:{ids.new_id()}"
    results = []
    for _ in range(5):
        with db.transaction(write=True) as s:
            results.append(limits.consume(s, name, 600, 3))
    assert results == [(1, 600), (2, 600), (3, 600), None, None]
    with db.transaction(write=True) as s:
        assert limits.stored(s, name) == (3, 600)
        assert limits.consume(s, name, 660, 3) == (1, 660)
        limits.reset(s, "test:")
        assert limits.stored(s, name) is None
    with db.transaction(write=True) as s:
        assert limits.consume(s, name, 660, 3) == (1, 660)


def _sqlite(tmp_path, busy_timeout_ms: int) -> tuple[Database, sqlite3.Connection]:
    """A SQLite database of its own (one write lock for every process: PostgreSQL has none,
    so these run on SQLite in both test runs), with a table, and another process's connection
    to it, in autocommit."""
    path = tmp_path / "locked.db"
    db = Database(
        Settings(database_url=f"sqlite:///{path}", sqlite_busy_timeout_ms=busy_timeout_ms)
    )
    with db.transaction(write=True) as session:
        session.execute(text("CREATE TABLE t (x INTEGER)"))
    return db, sqlite3.connect(path, isolation_level=None, check_same_thread=False)


@pytest.mark.parametrize(
    ("yielding", "every"),
    [
        (False, database_module.SQLITE_LOCK_POLL_SECONDS),
        (True, database_module.SQLITE_YIELDING_POLL_SECONDS),
    ],
    ids=["a decision's pace", "a long write's batch"],
)
def test_a_write_polls_for_sqlites_lock_and_takes_it_when_the_holder_lets_go(
    tmp_path, monkeypatch, yielding, every
):
    """A write transaction waits for another process's write lock by trying again every
    fraction of a millisecond (SQLite's own busy handler sleeps up to 100 ms between tries: a
    deletion's batch waited 330 ms behind a fold that kept taking the lock, and every
    decision of its process behind it); a batch of a long write (a prune's, an erasure's, a
    fold's) tries ten times less often, so that decisions take the lock first. Its connection
    goes back with the busy timeout it had, which reads and other statements still wait by."""
    assert database_module.SQLITE_YIELDING_POLL_SECONDS > database_module.SQLITE_LOCK_POLL_SECONDS
    db, other = _sqlite(tmp_path, busy_timeout_ms=30_000)
    other.execute("BEGIN IMMEDIATE")
    polled = threading.Event()
    sleep = time.sleep
    slept: list[float] = []

    def polling(seconds: float) -> None:
        slept.append(seconds)
        polled.set()
        sleep(seconds)

    monkeypatch.setattr(database_module.time, "sleep", polling)
    failed: list[BaseException] = []

    def write() -> None:
        try:
            with db.transaction(write=True, yielding=yielding) as session:
                session.execute(text("INSERT INTO t VALUES (1)"))
        except BaseException as exc:  # reported to the test below
            failed.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    assert polled.wait(30), "the write did not poll for the lock"
    assert writer.is_alive()  # it waits while the other process holds the lock
    other.execute("COMMIT")
    writer.join(30)
    assert not writer.is_alive()
    assert not failed
    assert set(slept) == {every}
    assert other.execute("SELECT count(*) FROM t").fetchone() == (1,)
    with db.connect() as connection:
        timeout = connection.exec_driver_sql("PRAGMA busy_timeout").scalar_one()
    assert timeout == 30_000
    db.dispose()


def test_a_write_that_never_gets_sqlites_lock_fails_after_the_busy_timeout_changing_nothing(
    tmp_path,
):
    db, other = _sqlite(tmp_path, busy_timeout_ms=50)
    other.execute("BEGIN IMMEDIATE")
    with pytest.raises(StorageError), db.transaction(write=True) as session:
        session.execute(text("INSERT INTO t VALUES (1)"))
    other.execute("COMMIT")
    assert other.execute("SELECT count(*) FROM t").fetchone() == (0,)
    with db.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar_one() == 50
    db.dispose()
