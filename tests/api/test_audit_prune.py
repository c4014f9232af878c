"""Retention by archive-then-prune (decisions §9): ``agentauth audit prune`` writes the oldest
entries to a gzip JSONL archive with a signed checkpoint, verifies it, and only then removes
them; the log that goes on still verifies, from the pruned head, against the database and
offline across archive and export; a prune stopped after any step loses nothing and the next
run completes it. On SQLite and on PostgreSQL."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from core.config import Settings
from core.domain.auditchain import Checkpoint, parse_note
from core.domain.clock import isoformat
from core.domain.errors import ConfigError, StorageError
from core.store import partitions, retention
from tests.api.test_audit_chain import listed
from tests.api.test_export import append_entries
from tests.audit_chain import AuditLog, audit_log_of_its_own, verify
from tests.conftest import FakeClock, Tenant
from tests.server import running_server

KEPT = 3


@pytest.fixture
def log(tmp_path: Path, audit_key_file: str, clock: FakeClock) -> Iterator[AuditLog]:
    """A workspace's log on a database of this test's own (a test that tampers takes its
    guards away), with one agent allowed calendar.*."""
    with audit_log_of_its_own(tmp_path, audit_key_file, clock, "prune") as found:
        yield found


@pytest.fixture
def aged(log: AuditLog, clock) -> dict[str, Any]:
    """Five decisions, then an hour later three more: the cut falls between them."""
    log.decide(5)
    cut = clock.moment + timedelta(seconds=1)
    clock.advance(3600)
    log.decide(KEPT)
    return {"cut": isoformat(cut), "before": log.checkpoint_file()}


def _prune(log: AuditLog, cut: str, folder: Path, *extra: str) -> Any:
    return log.cli(
        "prune", "--db", log.database_url, "--before", cut, "--archive", folder, *extra,
        workspace=True,
    )  # fmt: skip


def _archive(folder: Path, log: AuditLog, first: int, last: int) -> tuple[Path, Path]:
    stem = f"{log.workspace.name}-{first}-{last}"
    return folder / f"{stem}.jsonl.gz", folder / f"{stem}.checkpoint"


def test_prune_archives_verifies_then_removes(log, aged, tmp_path):
    folder = tmp_path / "archive"
    result = _prune(log, aged["cut"], folder)
    assert result.exit_code == 0, result.output
    archive, note = _archive(folder, log, 1, 5)
    assert "archived entries 1 to 5 (5)" in result.stdout
    assert [line["seq"] for line in _archived(archive)] == [1, 2, 3, 4, 5]
    assert Checkpoint.parse(parse_note(note.read_text()).text).size == 5
    # the list, the totals and the export skip the pruned entries; the prune is an entry
    entries = listed(log)
    assert [e["seq"] for e in entries] == [9, 8, 7, 6]
    prune_entry = entries[0]
    assert prune_entry["action"] == "audit.prune"
    assert "1 to 5" in prune_entry["reason"]
    assert archive.name in prune_entry["reason"]
    total = log.client.get("/v1/audit-logs", headers=log.headers).json["pagination"]["total"]
    assert total == KEPT + 1
    assert [line["seq"] for line in log.export()] == [6, 7, 8, 9]
    # the checkpoint endpoint keeps answering the whole log's size
    assert log.checkpoint_note().split("\n")[1] == "9"


def test_an_archive_read_in_bites_holds_every_entry_once_and_verifies(
    log, aged, tmp_path, monkeypatch
):
    """The archive is read a few entries a transaction (no read held open for minutes): 5
    entries in bites of 2 are 1 to 5, once each, and the prune verifies them."""
    monkeypatch.setattr(retention, "ARCHIVE_BITE", 2)
    folder = tmp_path / "archive"
    result = _prune(log, aged["cut"], folder)
    assert result.exit_code == 0, result.output
    assert "verified the archive of entries 1 to 5; removing them" in result.stdout
    archive, _ = _archive(folder, log, 1, 5)
    assert [line["seq"] for line in _archived(archive)] == [1, 2, 3, 4, 5]
    assert [e["seq"] for e in listed(log)] == [9, 8, 7, 6]


def test_the_log_verifies_after_a_prune_in_the_database_and_offline(log, aged, tmp_path):
    folder = tmp_path / "archive"
    assert _prune(log, aged["cut"], folder).exit_code == 0
    archive, note = _archive(folder, log, 1, 5)
    # the database, from the pruned head, against a checkpoint taken before the prune
    verdict = log.verify_db(aged["before"])
    assert verdict.code == 0, verdict.report
    assert verdict.report["start"] == 5
    assert verdict.report["checkpoints"] == 1
    now = log.checkpoint_file()
    key = log.public_key_file()
    live = log.export_file()
    cases = [
        ["--export", archive, "--checkpoint", note],  # the archive alone
        ["--export", live, "--checkpoint", note, "--checkpoint", now],  # the rest, from it
        ["--export", archive, "--export", live, "--checkpoint", now],  # both, in order
    ]
    for flags in cases:
        verdict = verify(log.key_file, *flags, "--public-key", key)
        assert verdict.code == 0, (flags, verdict.report)
    # the export that goes on does not verify alone: it does not start at 1
    verdict = verify(log.key_file, "--export", live, "--checkpoint", now, "--public-key", key)
    assert verdict.failure == (5, "missing")


def test_a_changed_kept_entry_still_fails_verification(log, aged, tmp_path):
    assert _prune(log, aged["cut"], tmp_path / "archive").exit_code == 0
    with log.as_superuser() as session:
        session.execute(
            text("UPDATE audit_log SET reason = 'rewritten' WHERE workspace_id = :w AND seq = 7"),
            {"w": log.workspace.id},
        )
    verdict = log.verify_db()
    assert verdict.failure == (7, "changed")


def test_a_dry_run_says_what_and_changes_nothing(log, aged, tmp_path):
    folder = tmp_path / "archive"
    result = _prune(log, aged["cut"], folder, "--dry-run")
    assert result.exit_code == 0, result.output
    assert "would archive entries 1 to 5 (5)" in result.stdout
    assert not folder.exists()
    assert len(listed(log)) == 5 + KEPT


def test_nothing_before_the_cut_prunes_nothing(log, tmp_path):
    log.decide(2)
    result = _prune(log, "2000-01-01T00:00:00Z", tmp_path / "archive")
    assert result.exit_code == 0, result.output
    assert "nothing to prune" in result.stdout
    assert len(listed(log)) == 2


@pytest.mark.parametrize("before", ["yesterday", "2026-13-01T00:00:00Z"])
def test_a_bad_cut_exits_2_changing_nothing(log, tmp_path, before):
    log.decide(1)
    result = _prune(log, before, tmp_path / "archive")
    assert result.exit_code == 2
    assert "--before" in result.output
    assert len(listed(log)) == 1


def test_an_entry_past_the_pruned_head_cannot_be_deleted(log, aged, tmp_path):
    assert _prune(log, aged["cut"], tmp_path / "archive").exit_code == 0
    with pytest.raises(StorageError), log.db.transaction(write=True) as session:
        session.execute(
            text("DELETE FROM audit_log WHERE workspace_id = :w AND seq = 6"),
            {"w": log.workspace.id},
        )
    assert _rows(log)[0] == 6


# ------------------------------------------------------------- a prune stopped midway


def _archived(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path) as file:
        return [json.loads(line) for line in file.read().splitlines()]


def _plan(log: AuditLog, cut: str) -> retention.Plan:
    from core.domain.clock import parse_instant

    with log.db.transaction() as session:
        taken = retention.plan(session, log.workspace.id, parse_instant(cut))
    assert taken is not None
    return taken


def _rows(log: AuditLog) -> list[int]:
    with log.db.transaction() as session:
        return [
            int(seq)
            for (seq,) in session.execute(
                text("SELECT seq FROM audit_log WHERE workspace_id = :w ORDER BY seq"),
                {"w": log.workspace.id},
            )
        ]


@pytest.mark.parametrize("stopped_after", ["archive", "record", "part-of-the-removal"])
def test_a_prune_stopped_after_any_step_loses_nothing_and_the_next_completes(
    log,
    aged,
    tmp_path,
    stopped_after,
):
    """What each step leaves when the process is killed right after it (each step commits
    or syncs before the next begins): the next run completes the prune."""
    folder = tmp_path / "archive"
    taken = _plan(log, aged["cut"])
    key = log.app.extensions["agentauth"].audit_key()
    archive, note = retention.write_archive(log.db, taken, folder, log.workspace.name, key)
    if stopped_after != "archive":
        checkpoint = Checkpoint.parse(parse_note(note.read_text()).text)
        with log.db.transaction(write=True) as session:
            retention.record(session, taken, checkpoint.head)
    if stopped_after == "part-of-the-removal":
        with log.db.transaction(write=True) as session:  # what one batch of a removal does
            session.execute(
                text("DELETE FROM audit_log WHERE workspace_id = :w AND seq <= 2"),
                {"w": log.workspace.id},
            )
    # nothing lost: every entry is in the database or in the verified archive
    kept = _rows(log)
    archived = [line["seq"] for line in _archived(archive)]
    assert sorted(set(kept) | set(archived)) == list(range(1, 5 + KEPT + 1))
    verdict = log.verify_db(aged["before"])
    assert verdict.code == 0, verdict.report
    result = _prune(log, aged["cut"], folder)
    assert result.exit_code == 0, result.output
    assert _rows(log)[0] > 5
    verdict = log.verify_db(aged["before"])
    assert verdict.code == 0, verdict.report
    assert verdict.report["start"] == 5


def test_an_agent_deleted_while_a_prune_removes_leaves_its_counts_exact(
    log, aged, tmp_path, monkeypatch, clock
):
    """An agent deleted while its pruned entries are being removed erases only its kept
    ones: the pruned hour's counts, which the removal is deleting, are not taken back a
    second time (they would go below zero)."""
    from core.store import auditcounts

    settled = auditcounts.settled
    deleted: list[int] = []

    def then_delete_the_agent(*args: Any) -> bool:
        found = settled(*args)  # the hour's rollup rows go next
        if not deleted:
            answer = log.client.delete(f"/v1/agents/{log.agent}", headers=log.headers)
            deleted.append(answer.status_code)
        return found

    monkeypatch.setattr(auditcounts, "settled", then_delete_the_agent)
    window = {
        "from": isoformat(clock.moment - timedelta(days=2)),
        "to": isoformat(datetime.now(UTC) + timedelta(days=1)),  # the prune's entry: now
    }
    result = _prune(log, aged["cut"], tmp_path / "archive")
    assert result.exit_code == 0, result.output
    assert deleted == [204]
    auditcounts.drain(log.db)
    # kept: the three decisions after the cut, erased with their agent, and the prune's entry
    assert _total(log) == 1
    assert _stats(log, **window) == 1
    answer = log.client.get(
        "/v1/audit-logs/stats", headers=log.headers, query_string={**window, "bucket": "hour"}
    )
    assert all(item["count"] > 0 for item in answer.get_json()["data"])


#: how many entries the killed prunes take: enough that each step lasts a while
KILLED = 12_000


def _seen(condition: Any, process: subprocess.Popen[bytes], what: str) -> None:
    """Wait until ``condition()`` holds, while ``process`` runs (a hang guard of 120 s)."""
    deadline = time.monotonic() + 120
    while not condition():
        assert process.poll() is None, f"the prune ended before {what}"
        assert time.monotonic() < deadline, f"no {what} within 120 s"
        time.sleep(0.001)


def _pruned_seq(log: AuditLog) -> int:
    with log.db.transaction() as session:
        return int(
            session.execute(
                text("SELECT pruned_seq FROM audit_heads WHERE workspace_id = :w"),
                {"w": log.workspace.id},
            ).scalar()
            or 0
        )


@pytest.mark.parametrize("step", ["writing-the-archive", "archived", "recorded", "removing"])
def test_a_prune_killed_at_each_step_loses_nothing_and_the_next_run_completes(
    log, clock, tmp_path, step
):
    """``agentauth audit prune`` as its own process, sent SIGKILL once the step is seen from
    outside (the archive's partial file, the archive, the pruned head in the database, the
    first entries gone): every entry is then in the database or in a verified archive, the
    log verifies, and running the prune again completes the work."""
    append_entries(log.app, log.workspace, clock, log.agent, KILLED, reason="r" * 200)
    cut = isoformat(clock.moment + timedelta(seconds=1))
    clock.advance(3600)
    log.decide(KEPT)
    before = log.checkpoint_file()
    folder = tmp_path / "archive"
    archive, note = _archive(folder, log, 1, KILLED)
    environment = {
        **os.environ,
        "AGENTAUTH_AUDIT_KEY_FILE": log.key_file,
        "AGENTAUTH_DATABASE_URL": log.database_url,
    }
    environment.pop("AGENTAUTH_AUDIT_KEY", None)
    command = [
        sys.executable, "-m", "controller", "audit", "prune", "--workspace", log.workspace.name,
        "--before", cut, "--archive", str(folder),
    ]  # fmt: skip
    process = subprocess.Popen(command, env=environment, stdout=subprocess.DEVNULL)
    try:
        partial = archive.with_name(archive.name + ".partial")
        seen = {
            "writing-the-archive": partial.exists,
            "archived": archive.exists,
            "recorded": lambda: _pruned_seq(log) == KILLED,
            "removing": lambda: 0 < len(_rows(log)) < KILLED + KEPT,
        }[step]
        _seen(seen, process, step)
        process.kill()
    finally:
        process.kill()
        process.wait()
    kept = _rows(log)
    archived = [line["seq"] for line in _archived(archive)] if archive.exists() else []
    if kept[0] > 1:  # entries are gone only once the archive holding them verified
        assert note.exists()
        flags = ("--export", archive, "--checkpoint", note, "--public-key", log.public_key_file())
        assert verify(log.key_file, *flags).code == 0
    assert kept[-1] >= KILLED + KEPT  # (and the prune's own entry, when it was written)
    assert sorted(set(kept) | set(archived)) == list(range(1, kept[-1] + 1))
    verdict = log.verify_db(before)
    assert verdict.code == 0, verdict.report
    result = _prune(log, cut, folder)
    assert result.exit_code == 0, result.output
    assert _rows(log)[0] == KILLED + 1
    assert _total(log) == KEPT + 1  # and one prune entry, whichever run wrote it
    verdict = log.verify_db(before)
    assert verdict.code == 0, verdict.report
    assert verdict.report["start"] == KILLED
    assert not partial.exists()


# ------------------------------------------------------------------- retention in serve


@pytest.mark.parametrize(
    "environment",
    [
        {"AGENTAUTH_AUDIT_RETENTION_DAYS": "30"},
        {"AGENTAUTH_AUDIT_ARCHIVE_DIR": "/var/lib/agentauth/archive"},
    ],
    ids=["days-alone", "folder-alone"],
)
def test_serve_refuses_half_a_retention_saying_why(environment, tmp_path):
    with pytest.raises(ConfigError, match="go together"):
        Settings.from_env(environment)
    env = {k: v for k, v in os.environ.items() if "RETENTION" not in k and "ARCHIVE" not in k}
    done = subprocess.run(
        [sys.executable, "-m", "controller", "serve", "--port", "1", "--db",
         f"sqlite:///{tmp_path / 'never.db'}"],
        env={**env, **environment}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0
    assert "AGENTAUTH_AUDIT_RETENTION_DAYS and AGENTAUTH_AUDIT_ARCHIVE_DIR" in done.stderr
    assert not (tmp_path / "never.db").exists()


def test_serve_archives_and_prunes_what_is_older_than_the_retention(
    database_url, workspace, app, tmp_path, cli
):
    """The real thing: entries of 40 days ago and of now; serve with a retention of 30 days
    archives and prunes the old ones at start, and the log verifies from there."""
    from core.domain.clock import utc_now
    from tests.api.helpers import aged_entries, record_audit_entries

    now = utc_now()
    rows = aged_entries(workspace.id, 4, 6, now)
    workspace.key("admin")  # the workspace exists
    record_audit_entries(app, rows)
    folder = tmp_path / "archive"
    env = {"AGENTAUTH_AUDIT_RETENTION_DAYS": "30", "AGENTAUTH_AUDIT_ARCHIVE_DIR": str(folder)}
    archive = folder / f"{workspace.name}-1-4.jsonl.gz"
    with running_server(database_url, workers=1, env=env):
        deadline = time.monotonic() + 30
        while not (archive.exists() and _pruned_to(app, workspace.id) == 4):
            assert time.monotonic() < deadline, "nothing pruned within the deadline"
            time.sleep(0.05)  # polling the database, bounded by the deadline
    result = cli("audit", "verify", "--workspace", workspace.name)
    assert result.exit_code == 0, result.output
    assert "1 to 4 pruned" in result.output
    assert [line["seq"] for line in _archived(archive)] == [1, 2, 3, 4]


def _pruned_to(app: Any, workspace_id: str) -> int:
    with app.extensions["agentauth"].db.transaction() as session:
        return retention.pruned_head(session, workspace_id)[0]


# ------------------------------------------------ where the pruned entries go (issue #32)
# On PostgreSQL the log is partitioned by UTC day, the service makes the days ahead, and a
# prune drops each day it emptied of kept entries as a whole partition (a day that still holds
# another workspace's kept entry stays, its pruned rows deleted one by one); on SQLite the
# pages a prune freed go back to the file system. Either way totals, stats and verification
# come out as before.

DAY0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)


def _postgres(log: AuditLog) -> bool:
    return log.database_url.startswith("postgresql")


def _days(log: AuditLog) -> list[str]:
    with log.db.transaction() as session:
        return [day.name for day in partitions.days(session)]


def _make_days(log: AuditLog, first: datetime, count: int) -> None:
    with log.db.transaction(write=True) as session:
        partitions.create(
            session, [partitions.day_of(first.date() + timedelta(days=n)) for n in range(count)]
        )


def _total(log: AuditLog, **params: str) -> int:
    answer = log.client.get("/v1/audit-logs", headers=log.headers, query_string=params)
    assert answer.status_code == 200, answer.get_json()
    return answer.get_json()["pagination"]["total"]


def _stats(log: AuditLog, **params: str) -> int:
    answer = log.client.get("/v1/audit-logs/stats", headers=log.headers, query_string=params)
    assert answer.status_code == 200, answer.get_json()
    return sum(item["count"] for item in answer.get_json()["data"])


@pytest.fixture
def three_days(log: AuditLog, clock: FakeClock) -> dict[str, int]:
    """Four decisions on each of three days (made ahead on PostgreSQL, as the service does)."""
    if _postgres(log):
        _make_days(log, DAY0, 3)
    clock.moment = DAY0
    for _ in range(3):
        log.decide(4)
        clock.moment += timedelta(days=1)
    return {"per_day": 4}


def test_the_service_makes_the_days_ahead_on_postgresql(log: AuditLog, clock: FakeClock):
    with log.db.transaction(write=True) as session:
        made = partitions.ensure(session, clock())
    if not _postgres(log):
        assert made == []  # SQLite has no partitions
        return
    today = clock.moment.date()
    wanted = {partitions.day_of(today + timedelta(days=n)).name for n in range(8)}
    assert wanted <= set(_days(log))
    with log.db.transaction(write=True) as session:  # again: nothing more to make
        assert partitions.ensure(session, clock()) == []


def test_a_prune_drops_the_days_it_emptied_and_counts_stay_exact(
    log: AuditLog, three_days, clock: FakeClock, tmp_path: Path
):
    per_day = three_days["per_day"]
    before_days = _days(log)
    everything = isoformat(DAY0 - timedelta(days=1))
    assert _total(log) == 3 * per_day
    cut = isoformat(DAY0 + timedelta(days=2) - timedelta(hours=1))  # the end of day two
    result = _prune(log, cut, tmp_path / "archive")
    assert result.exit_code == 0, result.output
    assert f"removed {2 * per_day} entries" in result.stdout
    kept = _total(log, **{"from": everything})
    assert kept == per_day + 1  # day three's, and the prune's own entry
    later = isoformat(datetime.now(UTC) + timedelta(days=1))  # the prune's entry: real time
    assert _stats(log, **{"from": everything, "to": later, "bucket": "day"}) == kept
    assert _total(log, tool_name="calendar.read", agent_id=log.agent) == per_day
    assert log.verify_db().code == 0
    if _postgres(log):
        gone = {partitions.day_of((DAY0 + timedelta(days=n)).date()).name for n in (0, 1)}
        assert gone <= set(before_days)
        assert not gone & set(_days(log))
        third = partitions.day_of((DAY0 + timedelta(days=2)).date()).name
        assert third in _days(log)


def test_a_day_another_workspace_keeps_is_not_dropped_until_it_is_pruned(
    log: AuditLog, three_days, clock: FakeClock, tmp_path: Path
):
    if not _postgres(log):
        pytest.skip("partitions are PostgreSQL's")
    other = Tenant(log.app, f"{log.workspace.name}-b", clock)
    clock.moment = DAY0 + timedelta(hours=1)
    other_log = AuditLog(log.app, other, log.database_url, log.key_file, log.folder)
    other_log.decide(2)
    cut = isoformat(DAY0 + timedelta(days=1) - timedelta(hours=1))
    first = partitions.day_of(DAY0.date()).name
    result = _prune(log, cut, tmp_path / "a")
    assert result.exit_code == 0, result.output
    assert first in _days(log)  # the other workspace still keeps two entries in it
    assert _total(log, **{"from": isoformat(DAY0)}) == 2 * 4 + 1
    result = _prune(other_log, cut, tmp_path / "b")
    assert result.exit_code == 0, result.output
    assert first not in _days(log)
    assert _total(other_log, **{"from": isoformat(DAY0)}) == 1  # its prune's own entry
    assert log.verify_db().code == 0
    assert other_log.verify_db().code == 0


def test_a_day_whose_drop_waits_too_long_keeps_its_partition_and_counts_stay_exact(
    log: AuditLog, three_days, clock: FakeClock, tmp_path: Path
):
    """The drop waits at most partitions.LOCK_TIMEOUT_MS for the table's lock (a long reader
    holds it here): the day stays, and its rollup rows, forgotten in the same transaction
    before the DROP, come back with it, so the totals and stats are what they were."""
    if not _postgres(log):
        pytest.skip("partitions are PostgreSQL's")
    import sqlalchemy as sa

    per_day = three_days["per_day"]
    everything = isoformat(DAY0 - timedelta(days=1))
    first = partitions.day_of(DAY0.date()).name
    reader = sa.create_engine(log.database_url, poolclass=sa.pool.NullPool)
    try:
        with reader.connect() as connection:
            connection.execute(text(f'LOCK TABLE "{first}" IN ACCESS SHARE MODE'))
            cut = isoformat(DAY0 + timedelta(days=1) - timedelta(hours=1))  # day one's end
            result = _prune(log, cut, tmp_path / "archive")
            assert result.exit_code == 0, result.output
            assert first in _days(log)
            connection.rollback()
    finally:
        reader.dispose()
    kept = _total(log, **{"from": everything})
    assert kept == 2 * per_day + 1  # days two and three, and the prune's own entry
    later = isoformat(datetime.now(UTC) + timedelta(days=1))
    assert _stats(log, **{"from": everything, "to": later, "bucket": "day"}) == kept
    assert log.verify_db().code == 0


def test_an_entry_of_a_day_with_no_partition_is_kept_in_the_default_one(
    log: AuditLog, clock: FakeClock
):
    """A decision is never refused for want of a partition; the day it fell on is then left
    to the default partition (making it would mean moving entries)."""
    if not _postgres(log):
        pytest.skip("partitions are PostgreSQL's")
    clock.moment = datetime(2024, 2, 29, 12, 0, tzinfo=UTC)
    log.decide(1)
    with log.db.transaction() as session:
        held = session.execute(
            text(f"SELECT count(*) FROM {partitions.DEFAULT} WHERE workspace_id = :w"),
            {"w": log.workspace.id},
        ).scalar()
    assert held == 1
    _make_days(log, clock.moment, 1)
    assert partitions.day_of(clock.moment.date()).name not in _days(log)
    assert _total(log) == 1


def test_a_prune_leaves_no_pruned_row_and_gives_sqlites_space_back(log: AuditLog, clock, tmp_path):
    """Every pruned row is gone from the table (on PostgreSQL these lie in the default
    partition: no day was made for them); on SQLite the file shrinks, no free page left."""
    clock.moment = DAY0
    append_entries(log.app, log.workspace, clock, log.agent, 3000, reason="x" * 400)
    clock.advance(3600)
    log.decide(1)
    size = 0 if _postgres(log) else Path(log.database_url.removeprefix("sqlite:///")).stat().st_size
    result = _prune(log, isoformat(DAY0 + timedelta(minutes=30)), tmp_path / "archive")
    assert result.exit_code == 0, result.output
    assert "removed 3000 entries" in result.stdout
    assert _rows(log)[0] == 3001
    if _postgres(log):
        return
    with log.db.transaction() as session:
        free = session.execute(text("PRAGMA freelist_count")).scalar()
        pages = session.execute(text("PRAGMA page_count")).scalar()
        size_of_page = session.execute(text("PRAGMA page_size")).scalar()
    assert free == 0
    assert pages * size_of_page < size / 2


def test_a_prune_whose_cut_falls_inside_an_hour_keeps_that_hours_counts_exact(
    log: AuditLog, clock: FakeClock, tmp_path: Path
):
    """The hours wholly pruned lose their counts at once; the hour the kept entries begin in
    loses those of its pruned entries one by one: every total and bucket stays exact."""
    clock.moment = DAY0
    log.decide(3)  # 09:00, an hour wholly pruned
    clock.moment = DAY0 + timedelta(hours=1, minutes=10)
    log.decide(4)  # 10:10, pruned
    cut = isoformat(clock.moment + timedelta(seconds=1))
    clock.moment = DAY0 + timedelta(hours=1, minutes=40)
    log.decide(2, tool="calendar.list")  # 10:40, kept, in the same hour
    result = _prune(log, cut, tmp_path / "archive")
    assert result.exit_code == 0, result.output
    assert "removed 7 entries" in result.stdout
    window = {
        "from": isoformat(DAY0 - timedelta(hours=1)),
        "to": isoformat(DAY0 + timedelta(hours=3)),
    }
    assert _total(log, **window) == 2
    assert _total(log, **window, tool_name="calendar.read") == 0
    assert _total(log, **window, agent_id=log.agent, tool_name="calendar.list") == 2
    answer = log.client.get(
        "/v1/audit-logs/stats",
        headers=log.headers,
        query_string={**window, "bucket": "minute", "group_by": "tool"},
    )
    assert answer.get_json()["data"] == [
        {
            "start": isoformat(DAY0 + timedelta(hours=1, minutes=40)),
            "key": "calendar.list",
            "count": 2,
        }
    ]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
def test_a_prune_archives_below_the_decisions_and_removes_beside_them(
    log, aged, tmp_path, monkeypatch
):
    """``agentauth audit prune`` writes and verifies its archive below the server's workers,
    on a thread of its own; it removes entries, holding the write lock that decisions wait
    for, at their priority; the thread that called it is left as it was."""
    import threading

    from api.retention import PRUNE_NICE

    def nice() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    seen: dict[str, int] = {}
    write_archive, remove = retention.write_archive, retention.remove

    def writing(*args: Any) -> Any:
        seen["archive"] = nice()
        return write_archive(*args)

    def removing(*args: Any) -> Any:
        seen["remove"] = nice()
        return remove(*args)

    monkeypatch.setattr(retention, "write_archive", writing)
    monkeypatch.setattr(retention, "remove", removing)
    caller = nice()
    result = _prune(log, aged["cut"], tmp_path / "archive")
    assert result.exit_code == 0, result.output
    assert "archived entries 1 to 5 (5)" in result.stdout
    assert seen == {"archive": caller + min(PRUNE_NICE, 19 - caller), "remove": caller}
    assert nice() == caller
