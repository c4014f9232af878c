"""Parquet (decisions §9): ``GET /v1/audit-logs/export?format=parquet`` answers the entries of
the JSONL export (the same seq range, pruned entries left out, erased ones as placeholders) as a
Parquet file, one column per field named as in the JSON, read back here with pyarrow and held
row by row, column by column against the JSONL export; ``agentauth audit prune
--archive-format parquet`` writes the verified archive's Parquet form beside it; serve's
retention takes ``AGENTAUTH_AUDIT_ARCHIVE_FORMAT``. On SQLite and on PostgreSQL."""

from __future__ import annotations

import io
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from api import create_app
from core.config import Settings
from core.domain.clock import isoformat, utc_now
from core.domain.errors import ConfigError
from core.store import retention
from tests.api.helpers import aged_entries, decide, make_agent, record_audit_entries
from tests.audit_chain import AuditLog, fresh_database
from tests.conftest import FakeClock, Tenant
from tests.server import running_server

MEDIA_TYPE = "application/vnd.apache.parquet"
COLUMNS = [
    "seq", "id", "agentId", "action", "toolName", "parameters", "result", "policyId",
    "ruleIndex", "reason", "latencyMs", "timestamp", "approvalId", "sessionId", "hash",
    "entryHash", "erased", "hashVersion", "wouldBe",
]  # fmt: skip
ERASED = {"seq", "entryHash", "hash", "erased"}


@pytest.fixture
def log(tmp_path: Path, audit_key_file: str, clock: FakeClock) -> Iterator[AuditLog]:
    """A workspace's log on a database of this test's own, with one agent allowed calendar.*;
    a Parquet export of at most 4 entries (``parquet_export_limit``)."""
    with fresh_database(tmp_path) as url:
        settings = Settings(database_url=url, audit_key_file=audit_key_file, parquet_export_limit=4)
        app = create_app(settings, clock=clock)
        try:
            tenant = Tenant(app, f"parquet-{secrets.token_hex(4)}", clock)
            yield AuditLog(app, tenant, url, audit_key_file, tmp_path)
        finally:
            app.extensions["agentauth"].close()


def _parquet(log: AuditLog, **query: Any) -> Any:
    answer = log.client.get(
        "/v1/audit-logs/export", query_string={"format": "parquet", **query}, headers=log.headers
    )
    assert answer.status_code == 200, answer.get_data(as_text=True)
    assert answer.mimetype == MEDIA_TYPE
    assert answer.headers["Content-Disposition"].endswith('.parquet"')
    return answer


def _rows(data: bytes) -> list[dict[str, Any]]:
    table = pq.read_table(io.BytesIO(data))
    assert table.column_names == COLUMNS
    return table.to_pylist()


def _as_jsonl(row: dict[str, Any]) -> dict[str, Any]:
    """A Parquet row as the JSONL export writes the entry: its members, typed as JSON."""
    if row["erased"]:
        assert all(row[name] is None for name in COLUMNS if name not in ERASED), row
        return {name: row[name] for name in ERASED}
    assert row["entryHash"] is None
    line = {k: v for k, v in row.items() if k not in ("entryHash", "erased")}
    line["parameters"] = json.loads(row["parameters"])
    moment: datetime = row["timestamp"]
    line["timestamp"] = isoformat(moment)
    return line


def _held_against_jsonl(log: AuditLog, **query: Any) -> list[dict[str, Any]]:
    rows = _rows(_parquet(log, **query).get_data())
    lines = log.export(**query)
    assert [_as_jsonl(row) for row in rows] == lines
    return rows


def test_the_parquet_export_holds_the_jsonl_export_s_entries_column_by_column(log, clock):
    other = make_agent(
        log.client, log.headers, "other", [{"type": "tool_allowlist", "tools": ["*"]}]
    )
    log.decide(2)
    decide(log.client, log.headers, other, "mail.send", to="x@example.com", n=10**30)
    clock.advance(1)
    decide(log.client, log.headers, log.agent, "files.delete", path="/")  # denied
    rows = _held_against_jsonl(log)
    assert [row["result"] for row in rows] == ["allowed", "allowed", "allowed", "denied"]
    assert json.loads(rows[2]["parameters"]) == {"to": "x@example.com", "n": 10**30}
    # the types a reader gets: numbers as numbers, the instant as a UTC timestamp
    schema = pq.read_schema(io.BytesIO(_parquet(log).get_data()))
    assert str(schema.field("seq").type) == "int64"
    assert str(schema.field("latencyMs").type) == "double"
    assert str(schema.field("timestamp").type) == "timestamp[us, tz=UTC]"
    assert str(schema.field("parameters").type) == "extension<arrow.json>"


def test_erased_entries_are_placeholders_as_in_the_jsonl_export(log):
    log.decide(3)
    assert log.client.delete(f"/v1/agents/{log.agent}", headers=log.headers).status_code == 204
    rows = _held_against_jsonl(log)
    assert [row["erased"] for row in rows] == [True, True, True]
    assert all(row["entryHash"] and row["hash"] and row["agentId"] is None for row in rows)


@pytest.mark.parametrize(
    "query", [{"seq_from": 2}, {"seq_to": 3}, {"seq_from": 2, "seq_to": 3}, {"seq_from": 99}]
)
def test_the_seq_range_is_the_jsonl_export_s(log, query):
    log.decide(4)
    _held_against_jsonl(log, **query)


def test_pruned_entries_are_left_out(log, clock, tmp_path):
    log.decide(3)
    cut = clock.moment + timedelta(seconds=1)
    clock.advance(60)
    log.decide(2)
    pruned = log.cli(
        "prune", "--db", log.database_url, "--before", isoformat(cut), "--archive",
        tmp_path / "archive", workspace=True,
    )  # fmt: skip
    assert pruned.exit_code == 0, pruned.output
    rows = _held_against_jsonl(log)
    assert [row["seq"] for row in rows] == [4, 5, 6]  # 6: the prune's own entry
    assert rows[-1]["action"] == "audit.prune"


def test_an_empty_range_is_a_file_of_no_row(log):
    assert _rows(_parquet(log).get_data()) == []


def test_an_export_past_the_limit_holds_the_first_entries_and_says_so(log):
    log.decide(5)
    answer = _parquet(log)
    assert [row["seq"] for row in _rows(answer.get_data())] == [1, 2, 3, 4]
    assert answer.headers["X-Svc-Export-Truncated"] == "true"
    assert answer.headers["X-Svc-Export-Limit"] == "4"
    rest = _parquet(log, seq_from=5)
    assert [row["seq"] for row in _rows(rest.get_data())] == [5]
    assert "X-Svc-Export-Truncated" not in rest.headers


@pytest.mark.parametrize("kind", ["bogus", "PARQUET", ""])
def test_an_unknown_format_is_400_naming_format(log, kind):
    answer = log.client.get(
        "/v1/audit-logs/export", query_string={"format": kind}, headers=log.headers
    )
    assert answer.status_code == 400
    error = answer.json["error"]
    assert error["code"] == "VALIDATION_ERROR"
    assert error["details"][0]["field"] == "format"
    assert "parquet" in error["details"][0]["message"]


# ------------------------------------------------------------------------ the prune's archive


def test_prune_with_archive_format_parquet_writes_both_and_they_hold_the_same(log, clock, tmp_path):
    log.decide(4)
    log.client.delete(f"/v1/agents/{log.agent}", headers=log.headers)  # erased ones too
    other = make_agent(
        log.client, log.headers, "other", [{"type": "tool_allowlist", "tools": ["*"]}]
    )
    decide(log.client, log.headers, other, "calendar.read", n=1)
    cut = clock.moment + timedelta(seconds=1)
    clock.advance(60)
    log.decide(1, agent=other)
    folder = tmp_path / "archive"
    pruned = log.cli(
        "prune", "--db", log.database_url, "--before", isoformat(cut), "--archive", folder,
        "--archive-format", "parquet", workspace=True,
    )  # fmt: skip
    assert pruned.exit_code == 0, pruned.output
    stem = f"{log.workspace.name}-1-5"
    table = folder / f"{stem}.parquet"
    assert f"Parquet form to {table}" in pruned.stdout
    assert sorted(p.name for p in folder.iterdir()) == [
        f"{stem}.checkpoint", f"{stem}.jsonl.gz", f"{stem}.parquet",
    ]  # fmt: skip
    archived = list(retention.read_archive(folder / f"{stem}.jsonl.gz"))
    rows = _rows(table.read_bytes())
    assert [_as_jsonl(row) for row in rows] == archived
    assert [row["erased"] for row in rows] == [True] * 4 + [False]


def test_the_archive_format_is_jsonl_unless_asked(log, clock, tmp_path):
    log.decide(2)
    cut = clock.moment + timedelta(seconds=1)
    folder = tmp_path / "archive"
    pruned = log.cli(
        "prune", "--db", log.database_url, "--before", isoformat(cut), "--archive", folder,
        workspace=True,
    )  # fmt: skip
    assert pruned.exit_code == 0, pruned.output
    assert not list(folder.glob("*.parquet"))


def test_an_unknown_archive_format_is_refused_changing_nothing(log, clock, tmp_path):
    log.decide(2)
    cut = clock.moment + timedelta(seconds=1)
    folder = tmp_path / "archive"
    pruned = log.cli(
        "prune", "--db", log.database_url, "--before", isoformat(cut), "--archive", folder,
        "--archive-format", "csv", workspace=True,
    )  # fmt: skip
    assert pruned.exit_code == 2
    assert "--archive-format" in pruned.output
    assert not folder.exists()
    assert [line["seq"] for line in log.export()] == [1, 2]


def test_serve_refuses_an_unknown_archive_format_saying_why(tmp_path):
    environment = {"AGENTAUTH_AUDIT_ARCHIVE_FORMAT": "csv"}
    with pytest.raises(ConfigError, match="AGENTAUTH_AUDIT_ARCHIVE_FORMAT must be one of"):
        Settings.from_env(environment)
    assert Settings.from_env(
        {"AGENTAUTH_AUDIT_ARCHIVE_FORMAT": "Parquet"}
    ).audit_archive_format == ("parquet")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTAUTH_")}
    done = subprocess.run(
        [sys.executable, "-m", "controller", "serve", "--port", "1", "--db",
         f"sqlite:///{tmp_path / 'never.db'}"],
        env={**env, **environment}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0
    assert "AGENTAUTH_AUDIT_ARCHIVE_FORMAT must be one of jsonl, parquet" in done.stderr
    assert not (tmp_path / "never.db").exists()


@pytest.mark.slow
def test_serve_s_retention_writes_parquet_archives_when_set(tmp_path, audit_key_file, clock):
    """Entries of 40 days ago and of now; serve with a retention of 30 days and
    AGENTAUTH_AUDIT_ARCHIVE_FORMAT=parquet archives the old ones in both forms, then prunes.
    On a database of its own: serve prunes every workspace at start, and the run's shared
    database holds every other test's old entries (under load, more than the deadline)."""
    with fresh_database(tmp_path) as url:
        app = create_app(Settings(database_url=url, audit_key_file=audit_key_file), clock=clock)
        try:
            workspace = Tenant(app, f"retained-{secrets.token_hex(4)}", clock)
            rows = aged_entries(workspace.id, 3, 5, utc_now())
            workspace.key("admin")  # the workspace exists
            record_audit_entries(app, rows)
            folder = tmp_path / "archive"
            env = {
                "AGENTAUTH_AUDIT_RETENTION_DAYS": "30",
                "AGENTAUTH_AUDIT_ARCHIVE_DIR": str(folder),
                "AGENTAUTH_AUDIT_ARCHIVE_FORMAT": "parquet",
            }
            with running_server(url, workers=1, env=env):
                deadline = time.monotonic() + 30
                while _pruned_to(app, workspace.id) != 3:
                    assert time.monotonic() < deadline, "nothing pruned within the deadline"
                    time.sleep(0.05)  # polling the database, bounded by the deadline
        finally:
            app.extensions["agentauth"].close()
    stem = folder / f"{workspace.name}-1-3"
    archived = list(retention.read_archive(stem.with_suffix(".jsonl.gz")))
    assert [_as_jsonl(row) for row in _rows(stem.with_suffix(".parquet").read_bytes())] == archived
    assert [line["seq"] for line in archived] == [1, 2, 3]


def _pruned_to(app: Any, workspace_id: str) -> int:
    with app.extensions["agentauth"].db.transaction() as session:
        return retention.pruned_head(session, workspace_id)[0]


def test_the_openapi_document_describes_the_parquet_export(client):
    operation = client.get("/v1/openapi.json").json["paths"]["/v1/audit-logs/export"]["get"]
    (format_,) = [p for p in operation["parameters"] if p["name"] == "format"]
    assert "parquet" in format_["schema"]["enum"]
    assert MEDIA_TYPE in operation["responses"]["200"]["content"]
