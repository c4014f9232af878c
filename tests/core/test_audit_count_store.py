"""The audit log's kept counts (decisions §9) as the store keeps them: a batch's tallies, folded
into the rollup rows later, count the same before, during and after the fold; migration 0006
counts a log written before it; erasure takes its entries back. Each against ``COUNT(*)`` of
the entries themselves, on SQLite and on PostgreSQL."""

from __future__ import annotations

import random
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from core.config import Settings
from core.domain import ids
from core.domain.auditchain import ZERO_HASH, chain_hash
from core.domain.auditcounts import DAY, HOUR, MINUTE
from core.hotpath.recorder import Recorder
from core.store import audit, auditcounts, auditstats, paced, retention
from core.store.audit import Filters
from core.store.database import Database
from core.store.migrate import upgrade
from core.store.models import Agent, AuditEntry, AuditHead, AuditTally, Workspace
from tests.audit_chain import fresh_database

START = datetime(2026, 11, 20, 22, 58, 31, 250000, tzinfo=UTC)
AGENTS = [str(uuid.UUID(int=n + 1)) for n in range(3)]
TOOLS = ["calendar.read", "email.send", "shell.exec"]
#: filters and ranges a person asks for: each counted from the rollups, the tallies and the
#: partial minutes at their edges
QUERIES = [
    Filters(),
    Filters(agent_id=AGENTS[0]),
    Filters(tool_name=TOOLS[1], result="denied"),
    Filters(agent_id=AGENTS[1], tool_name=TOOLS[2]),
    Filters(session_id="s-1"),
    Filters(session_id="s-1", agent_id=AGENTS[0]),
    Filters(action="approval.approve"),
    Filters(since=START + timedelta(minutes=7, seconds=3), until=START + timedelta(hours=2)),
    Filters(result="allowed", since=START + timedelta(hours=1, microseconds=1)),
    Filters(until=START + timedelta(minutes=61, seconds=59, microseconds=999999)),
]


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    with fresh_database(tmp_path) as url:
        database = Database(Settings(database_url=url))
        yield database
        database.dispose()


def _workspace(db: Database, name: str) -> str:
    workspace_id = ids.workspace_id(name)
    with db.transaction(write=True) as session:
        session.add(Workspace(id=workspace_id, name=name, created_at=START))
    return workspace_id


def _agent(db: Database, workspace_id: str, number: int, name: str) -> str:
    """An agent of the workspace (its entries can be erased); its id."""
    agent_id = str(uuid.UUID(int=number))
    with db.transaction(write=True) as session:
        session.add(
            Agent(
                id=agent_id, workspace_id=workspace_id, name=name, status="active",
                created_at=START, updated_at=START, policy_version=0,
            )
        )  # fmt: skip
    return agent_id


def _rows(workspace_id: str, count: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)  # noqa: S311 - test data
    return [
        audit.entry(
            workspace_id=workspace_id,
            agent_id=rng.choice(AGENTS),
            agent_exists=False,
            key_id=None,
            tool_name=rng.choice(TOOLS),
            parameters={"n": n},
            result=rng.choice(audit.RESULTS),
            policy_id=None,
            rule_index=None,
            reason="r",
            latency_ms=1.0,
            timestamp=START + timedelta(seconds=rng.randrange(3 * 3600), microseconds=n),
            session_id=rng.choice(["s-1", "s-2", None]),
            action="authorize" if n % 9 else "approval.approve",
        )
        for n in range(count)
    ]


def _record(db: Database, rows: list[dict[str, Any]], per_batch: int) -> None:
    recorder = Recorder.for_database(db)
    for first in range(0, len(rows), per_batch):
        part = rows[first : first + per_batch]
        recorder.run(lambda batch, part=part: [batch.append_audit(row) for row in part])
    recorder.close()


#: the columns migration 0010 adds to the log (decisions §10)
COLUMNS_OF_0010 = (
    "hash_version",
    "would_result",
    "would_policy_id",
    "would_rule_index",
    "would_reason",
)


def _before_0010(row: dict[str, Any]) -> dict[str, Any]:
    """A row as the log held it before migration 0010: without its columns."""
    return {name: value for name, value in row.items() if name not in COLUMNS_OF_0010}


def _record_before_0010(db: Database, workspace_id: str, rows: list[dict[str, Any]]) -> None:
    """Entries written as the recorder wrote them before migration 0010: chained on from the
    workspace's head with the first field set (no would-be decision), and counted in a tally,
    in one transaction."""
    with db.engine.begin() as connection:
        head = connection.execute(
            sa.select(AuditHead.seq, AuditHead.hash).where(AuditHead.workspace_id == workspace_id)
        ).first()
        seq, previous = (head.seq, bytes.fromhex(head.hash)) if head else (0, ZERO_HASH)
        written, tally = [], Counter[Any]()
        for row in rows:
            seq += 1
            own = audit.leaf({**row, "hash_version": 1}).hash(seq)
            previous = chain_hash(previous, own)
            written.append(
                {**_before_0010(row), "seq": seq, "entry_hash": own.hex(), "hash": previous.hex()}
            )
            tally[audit.signature(row)] += 1
        connection.execute(sa.insert(AuditEntry.__table__), written)
        top = {"workspace_id": workspace_id, "seq": seq, "hash": previous.hex()}
        if head is None:
            connection.execute(sa.insert(AuditHead.__table__).values(top))
        else:
            connection.execute(
                sa.update(AuditHead.__table__)
                .where(AuditHead.workspace_id == workspace_id)
                .values(seq=seq, hash=previous.hex())
            )
        counts = {"workspace_id": workspace_id, "counts": auditcounts.tally_text(tally)}
        connection.execute(auditcounts.TALLY, counts)


def _counted(db: Database, workspace_id: str) -> list[Any]:
    """What every query counts, and its stats by minute, hour and day, grouped and not."""
    found: list[Any] = []
    with db.transaction(snapshot=True) as session:
        for filters in QUERIES:
            found.append(auditstats.count(session, workspace_id, filters))
            start, end = auditstats.bounds(filters)
            for grain, group_by in ((MINUTE, None), (HOUR, "agent"), (DAY, "result")):
                found.append(
                    auditstats.series(session, workspace_id, filters, start, end, grain, group_by)
                )
    return found


def _truth(db: Database, workspace_id: str) -> list[int]:
    with db.transaction() as session:
        return [
            int(
                session.scalar(
                    sa.select(sa.func.count()).where(
                        AuditEntry.workspace_id == workspace_id,
                        AuditEntry.erased.is_(False),
                        *audit.clauses(filters),
                    )
                )
                or 0
            )
            for filters in QUERIES
        ]


def _tallies(db: Database) -> int:
    with db.transaction() as session:
        return int(session.scalar(sa.select(sa.func.count()).select_from(AuditTally)) or 0)


def _fold_all(db: Database) -> None:
    auditcounts.drain(db)


def test_counts_are_the_same_before_during_and_after_a_fold(db):
    workspace_id = _workspace(db, "folded")
    _record(db, _rows(workspace_id, 600, seed=1), per_batch=7)  # 86 tallies: more than a bite
    before = _counted(db, workspace_id)
    assert before[::4] == _truth(db, workspace_id)  # each query's count, then its 3 series
    with db.transaction(write=True) as session:  # one bite: some tallies folded, some not
        assert auditcounts.fold(session) >= auditcounts.FOLD_SIGNATURES
    assert 0 < _tallies(db) < 86
    assert _counted(db, workspace_id) == before
    _fold_all(db)
    assert _tallies(db) == 0
    assert _counted(db, workspace_id) == before


def test_a_fold_pass_with_a_time_budget_leaves_the_rest_for_the_next_counts_exact(db):
    """``agentauth serve`` folds for about half a second a pass, so that a backlog of tallies
    (a deletion's, a log written while no server ran) does not hold up the checkpoints and the
    deliveries kept by the same loop: a pass whose budget is spent after its first bite stops
    there, and the next passes fold the rest; the counts are exact all along."""
    workspace_id = _workspace(db, "a backlog")
    _record(db, _rows(workspace_id, 600, seed=5), per_batch=7)  # 86 tallies: more than a bite
    before = _counted(db, workspace_id)
    first = auditcounts.drain(db, seconds=0)  # spent once the first bite is done
    assert 0 < first < 600
    assert 0 < _tallies(db) < 86
    assert _counted(db, workspace_id) == before
    assert first + auditcounts.drain(db, seconds=60) == 600  # every signature, once
    assert _tallies(db) == 0
    assert _counted(db, workspace_id) == before


def test_a_second_of_batches_repeating_signatures_folds_in_one_transaction(db):
    """Under load, batches repeat the same agents, tools and results within a minute: one fold
    takes them all (one commit), however many tallies, where a bite of distinct signatures
    would have stopped at :data:`FOLD_SIGNATURES`."""
    workspace_id = _workspace(db, "repeating")
    rows = _rows(workspace_id, 900, seed=3)
    for n, row in enumerate(rows):  # 3 signatures, 300 batches
        row.update(
            agent_id=AGENTS[0], tool_name=TOOLS[n % 3], result="allowed", session_id=None,
            action="authorize", timestamp=START + timedelta(microseconds=n),
        )  # fmt: skip
    _record(db, rows, per_batch=3)
    assert _tallies(db) == 300
    before = _counted(db, workspace_id)
    with db.transaction(write=True) as session:
        assert auditcounts.fold(session) == 900
    assert _tallies(db) == 0
    assert _counted(db, workspace_id) == before
    with db.transaction() as session:
        assert auditstats.count(session, workspace_id, Filters(tool_name=TOOLS[1])) == 300


def test_erasure_takes_an_agents_entries_out_of_the_counts_folded_or_not(db):
    workspace_id = _workspace(db, "erased")
    mine = _agent(db, workspace_id, 99, "gone")
    rows = _rows(workspace_id, 300, seed=2)
    for row in rows[::3]:  # a third are the erased agent's, among the others
        row.update(agent_id=mine, agent_ref=mine)
    _record(db, rows[:150], per_batch=5)
    _fold_all(db)
    _record(db, rows[150:], per_batch=5)  # these stay as tallies
    with db.transaction(write=True) as session:
        assert audit.erase(session, workspace_id, mine) == 100
    assert _counted(db, workspace_id)[::4] == _truth(db, workspace_id)
    with db.transaction() as session:
        assert auditstats.count(session, workspace_id, Filters(agent_id=mine)) == 0
        assert auditstats.count(session, workspace_id, Filters()) == 200
    _fold_all(db)
    assert _counted(db, workspace_id)[::4] == _truth(db, workspace_id)


def test_migration_0006_counts_the_entries_written_before_it(tmp_path):
    """A log of 0005 (no counts), erased entries among it: after the upgrade every count is
    the entries', and decisions after it add to the same counts."""
    with fresh_database(tmp_path, revision="0005") as url:
        db = Database(Settings(database_url=url))
        workspace_id = _workspace(db, "before-counts")
        rows = _rows(workspace_id, 400, seed=3)
        for n, row in enumerate(rows):
            row.update(seq=n + 1, entry_hash="0" * 64, hash="0" * 64, erased=False)
            if n % 10 == 0:  # erased: not counted
                row.update({**audit.ERASED, "timestamp": row["timestamp"]})
        with db.engine.begin() as connection:
            connection.execute(sa.insert(AuditEntry.__table__), [_before_0010(r) for r in rows])
            head = {"workspace_id": workspace_id, "seq": len(rows), "hash": "0" * 64}
            connection.execute(sa.insert(AuditHead.__table__), head)
        upgrade(db)
        assert _counted(db, workspace_id)[::4] == _truth(db, workspace_id)
        with db.transaction() as session:
            assert auditstats.count(session, workspace_id, Filters()) == 360
        _record(db, _rows(workspace_id, 50, seed=4), per_batch=10)
        _fold_all(db)
        assert _counted(db, workspace_id)[::4] == _truth(db, workspace_id)
        db.dispose()


def test_migration_0009_an_agent_of_a_log_before_it_is_deleted_after_it(tmp_path):
    """A log of 0008 (entries that name their agent with a foreign key): after the upgrade
    the agent's deletion erases exactly its entries and removes it, the others' entries and
    counts stay, the chain still verifies, and the database file is sound."""
    from core.store import agents, chain

    with fresh_database(tmp_path, revision="0008") as url:
        db = Database(Settings(database_url=url))
        workspace_id = _workspace(db, "before-0009")
        mine = _agent(db, workspace_id, 98, "leaving")
        rows = _rows(workspace_id, 240, seed=5)
        for row in rows[::4]:
            row.update(agent_id=mine, agent_ref=mine)
        _record_before_0010(db, workspace_id, rows[:120])
        upgrade(db)
        _record(db, rows[120:], per_batch=6)  # written after it, by the recorder
        with db.transaction(write=True) as session:
            agents.delete_agent(session, workspace_id, mine)
        with db.transaction() as session:
            assert session.get(Agent, mine) is None
            erased = session.scalar(sa.select(sa.func.count()).where(AuditEntry.erased.is_(True)))
            assert erased == 60
            assert auditstats.count(session, workspace_id, Filters()) == 180
            assert auditstats.count(session, workspace_id, Filters(agent_id=mine)) == 0
            report = chain.verify(session, workspace_id)
            assert report.ok
            assert report.size == 240
        assert _counted(db, workspace_id)[::4] == _truth(db, workspace_id)
        if db.is_sqlite:
            with db.engine.connect() as connection:
                assert connection.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"
                assert connection.exec_driver_sql("PRAGMA foreign_key_check").all() == []
        db.dispose()


@contextmanager
def _steps(db: Database, session: Any) -> Iterator[list[int]]:
    """A counter of the SQLite virtual-machine steps (in hundreds) that ``session`` runs
    inside the block: the same work counts the same on every machine. Left at 0 on
    PostgreSQL, which has no such counter."""
    counter = [0]
    if not db.is_sqlite:
        yield counter
        return
    driver = session.connection().connection.driver_connection

    def step() -> int:
        counter[0] += 1
        return 0  # go on

    driver.set_progress_handler(step, 100)
    try:
        yield counter
    finally:
        driver.set_progress_handler(None, 0)


def test_each_erasure_batch_does_the_same_work_however_many_went_before(db):
    """Deleting an agent erases its entries a batch a transaction while other agents'
    decisions wait (on SQLite, for its write lock): each batch erases its share, none of
    another agent's, and finds its entries at once instead of walking past every entry erased
    before it (a walk that grew with each batch and held the lock 40 ms and more on a log of
    400,000 entries). On SQLite the work is counted in its virtual-machine steps, the same on
    every machine; PostgreSQL has no such counter."""
    workspace_id = _workspace(db, "erased in batches")
    mine = _agent(db, workspace_id, 99, "gone")
    rows = _rows(workspace_id, 8000, seed=3)
    for row in rows[::4]:  # a quarter are the erased agent's, among the others
        row.update(agent_id=mine, agent_ref=mine)
    _record(db, rows, per_batch=500)
    erased_each: list[int] = []
    steps: list[int] = []
    while True:
        with db.transaction(write=True) as session, _steps(db, session) as counter:
            erased = audit.erase(session, workspace_id, mine, 50)
        if not erased:
            break
        erased_each.append(erased)
        steps.append(counter[0])
    assert erased_each == [50] * 40  # 2,000 entries, 50 a batch
    if db.is_sqlite:
        assert max(steps[-5:]) <= 2 * max(steps[:5]), steps
    with db.transaction() as session:
        assert auditstats.count(session, workspace_id, Filters(agent_id=mine)) == 0
        assert auditstats.count(session, workspace_id, Filters()) == 6000


def _prune_head(db: Database, workspace_id: str, seq: int) -> None:
    """The workspace's pruned head moved to ``seq``, as a prune records it before removing."""
    with db.transaction(write=True) as session:
        session.execute(
            sa.update(AuditHead)
            .where(AuditHead.workspace_id == workspace_id)
            .values(pruned_seq=seq, pruned_hash="ab" * 32)
        )


class _Clock:
    """``time`` for the pacing: each reading of the clock a second after the last, each
    pause recorded (and passed on the clock)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.pauses: list[float] = []

    def monotonic(self) -> float:
        self.now += 1.0
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds


def test_a_prune_removal_leaves_decisions_three_quarters_of_sqlites_write_lock(db, monkeypatch):
    """Nobody waits to see a prune finish: on SQLite its removal pauses three times as long as
    each of its batches held the write lock that decisions wait for (an erasure, which its
    caller waits for, pauses as long as it held it). On PostgreSQL, with no such lock, the
    batches follow each other with no pause."""
    monkeypatch.setattr(paced, "MOST", 40)
    monkeypatch.setattr(paced, "FEWEST", 40)
    workspace_id = _workspace(db, "pruned at rest")
    rows = _rows(workspace_id, 400, seed=5)
    _record(db, rows, per_batch=100)
    _prune_head(db, workspace_id, len(rows))
    auditcounts.drain(db, paced=False)  # the decisions' tallies folded (paced as they are)
    clock = _Clock()
    monkeypatch.setattr(paced, "time", clock)
    monkeypatch.setattr(retention, "time", clock)
    assert retention.remove(db, workspace_id) == len(rows)
    if not db.is_sqlite:
        assert clock.pauses == []
        return
    # a batch reads the clock when it takes the lock and when it has committed: it held the
    # lock one second of this clock (two with a step of giving free pages back)
    assert clock.pauses
    assert set(clock.pauses) <= {retention.REST * 1, retention.REST * 2}
    assert retention.REST == 3


def test_a_prune_removal_batch_does_the_same_work_in_a_full_hour_as_in_a_quiet_one(db, monkeypatch):
    """A prune removes a pruned hour's entries a batch a transaction while decisions wait (on
    SQLite, for its write lock). A batch finds its entries at once, however many the hour
    holds: walking the hour's range for them held the lock 44 ms a batch in an hour of
    400,000 entries (an hour of a day of 8.6 million holds 358,000) against 2 ms. Batch sizes
    pinned, each batch's work counted in SQLite's virtual-machine steps; on PostgreSQL the
    batches and what is left are checked."""
    monkeypatch.setattr(paced, "FEWEST", 50)
    monkeypatch.setattr(paced, "MOST", 50)
    workspace_id = _workspace(db, "pruned by the hour")
    quiet, full = START.replace(hour=10, minute=0, second=0, microsecond=0), 400
    rows = _rows(workspace_id, full + 8000, seed=4)
    for n, row in enumerate(rows):  # 400 in the first hour, 8,000 in the next
        hour = quiet if n < full else quiet + timedelta(hours=1)
        row["timestamp"] = hour + timedelta(seconds=n * 3599 // len(rows))
    _record(db, rows, per_batch=500)
    _prune_head(db, workspace_id, len(rows))
    batches: list[tuple[datetime, int, int]] = []  # the hour, entries removed, steps
    remove_hour, pace_batch = retention._remove_hour, paced.Pace.batch

    def hour_counted(db, workspace_id, hour, pace, counts):  # type: ignore[no-untyped-def]
        batches.append((hour, -1, -1))  # where each hour's batches begin
        return remove_hour(db, workspace_id, hour, pace, counts)

    def counted(self, step):  # type: ignore[no-untyped-def]
        def counting(session: Any, size: int) -> int:
            with _steps(db, session) as counter:
                gone = step(session, size)
            if step.__name__ == "entries" and gone:
                batches.append((batches[-1][0], gone, counter[0]))
            return gone

        return pace_batch(self, counting)

    monkeypatch.setattr(retention, "_remove_hour", hour_counted)
    monkeypatch.setattr(paced.Pace, "batch", counted)
    assert retention.remove(db, workspace_id) == len(rows)
    by_hour: dict[datetime, list[tuple[int, int]]] = {}
    for hour, gone, steps in batches:
        by_hour.setdefault(hour, [])
        if gone > 0:
            by_hour[hour].append((gone, steps))
    assert [[gone for gone, _ in each] for each in by_hour.values()] == [[50] * 8, [50] * 160]
    if db.is_sqlite:
        quiet_steps = max(steps for _, steps in by_hour[quiet])
        full_steps = [steps for _, steps in by_hour[quiet + timedelta(hours=1)]]
        assert max(full_steps) <= 2 * quiet_steps, (quiet_steps, full_steps[:5])
    with db.transaction() as session:
        assert auditstats.count(session, workspace_id, Filters()) == 0
        left = session.scalar(sa.select(sa.func.count()).select_from(AuditEntry))
        assert left == 0
