"""The JSONL export through a real ``agentauth serve`` (issue #32): it is sent as it is produced
(chunked, no length, nothing on disk, its first line readable while the rest is still to
come); the README's offline recipe (the checkpoint first, then the export up to its size) makes
any cut of it fail ``agentauth audit verify``; a failure of the server part-way aborts the
answer after a line that is not JSON, so that neither the client nor verify takes it for
whole; and the independent verifier still reads it."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import psycopg
import pytest
from flask import Flask
from sqlalchemy import create_engine, text

from api import create_app
from api.streaming import FAILED_LINE
from core.config import Settings
from tests import independent_verifier
from tests.api.helpers import make_agent, record_audit_entries
from tests.conftest import FakeClock, Tenant, bearer
from tests.server import running_server

HANG_GUARD = 60  # seconds: how long any one read may block before the test fails
#: entries of about 1 KB: 20 MB, more than the pipe, the server's buffers and the sockets' hold
#: together, so the first line reaches the client while most of the export is still unread
ENTRIES = 20_000
PAD = "x" * 900


def _fill(app: Flask, tenant: Tenant, count: int) -> str:
    """``count`` entries of an agent of ``tenant``'s; an admin key's headers."""
    headers = bearer(tenant.key("admin"))
    agent = make_agent(
        app.test_client(), headers, "exporter", [{"type": "tool_allowlist", "tools": ["*"]}]
    )
    record_audit_entries(
        app,
        (
            {
                "workspace_id": tenant.id,
                "agent_id": agent,
                "agent_exists": True,
                "key_id": None,
                "tool_name": "bulk.tool",
                "parameters": {"i": n, "pad": PAD},
                "result": "allowed",
                "policy_id": None,
                "rule_index": None,
                "reason": "bulk",
                "latency_ms": 0.25,
                "timestamp": tenant.clock(),
            }
            for n in range(count)
        ),
    )
    return headers


@pytest.fixture(scope="module")
def served(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real server (its temporary files in a folder of this module's own) and an admin
    key's headers of a workspace with ENTRIES entries."""
    app = create_app(Settings(database_url=database_url))
    tenant = Tenant(app, f"stream-{secrets.token_hex(4)}", FakeClock())
    headers = _fill(app, tenant, ENTRIES)
    app.extensions["agentauth"].close()
    spool = tmp_path_factory.mktemp("spool")
    env = {"TMPDIR": str(spool)}
    with running_server(database_url, workers=1, env=env) as base:
        yield base, headers, spool


def _get(base: str, headers: dict[str, str], path: str, **params: Any) -> httpx.Response:
    answer = httpx.get(base + path, params=params, headers=headers, timeout=HANG_GUARD)
    assert answer.status_code == 200, answer.text
    return answer


def _verify(cli: Any, export: Path, checkpoint: Path, key: Path) -> Any:
    args = ["audit", "verify", "--export", export, "--checkpoint", checkpoint]
    return cli(*args, "--public-key", key, db=False)


def _recipe(served: Any, folder: Path) -> tuple[Path, Path, Path]:
    """The README's offline recipe: the checkpoint first, then the export up to its size."""
    base, headers, _spool = served
    checkpoint = folder / "checkpoint.txt"
    checkpoint.write_text(_get(base, headers, "/v1/audit-logs/checkpoint").text)
    size = int(checkpoint.read_text().splitlines()[1])
    key = folder / "public-key.txt"
    key.write_text(_get(base, headers, "/v1/audit-logs/public-key").text)
    export = folder / "export.jsonl"
    params = {"format": "jsonl", "seq_to": size}
    export.write_bytes(_get(base, headers, "/v1/audit-logs/export", **params).content)
    return export, checkpoint, key


@pytest.mark.slow
def test_the_export_is_sent_as_it_is_produced(served):
    base, headers, spool = served
    with httpx.stream(
        "GET", base + "/v1/audit-logs/export", params={"format": "jsonl"}, headers=headers,
        timeout=HANG_GUARD,
    ) as answer:  # fmt: skip
        assert answer.status_code == 200
        assert answer.headers["transfer-encoding"] == "chunked"
        assert "content-length" not in answer.headers
        assert "x-agentauth-streamed" not in answer.headers  # the front's mark stays inside
        lines = answer.iter_lines()
        first = json.loads(next(lines))
        assert (first["seq"], first["parameters"]["i"]) == (1, 0)
        # while the rest is still to come: nothing of it on disk, not even the pipe's name
        assert [p for p in spool.iterdir() if not p.name.startswith("agentauth-metrics-")] == []
        rest = sum(1 for line in lines if line)
    assert rest == ENTRIES - 1


@pytest.mark.slow
def test_the_recipe_s_export_verifies_and_the_independent_verifier_reads_it(served, cli, tmp_path):
    export, checkpoint, key = _recipe(served, tmp_path)
    result = _verify(cli, export, checkpoint, key)
    assert result.exit_code == 0, result.output
    assert len(export.read_bytes().splitlines()) == ENTRIES
    outcome = independent_verifier.verify(
        export.read_text(), [checkpoint.read_text()], key.read_text()
    )
    assert (outcome.ok, outcome.size) == (True, ENTRIES)


def _cut_mid_line(data: bytes) -> bytes:
    return data[: len(data) // 2]


def _cut_at_a_line_end(data: bytes) -> bytes:
    return data[: data.rindex(b"\n", 0, len(data) // 2) + 1]


def _cut_before_the_last_line(data: bytes) -> bytes:
    return data[: data.rindex(b"\n", 0, len(data) - 1) + 1]


def _cut_in_the_last_line(data: bytes) -> bytes:
    return data[:-10]


def _cut_to_nothing(data: bytes) -> bytes:
    return b""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("cut", "words"),
    [
        (_cut_mid_line, "is not JSON"),
        (_cut_at_a_line_end, "a checkpoint says it held"),
        (_cut_before_the_last_line, "a checkpoint says it held"),
        (_cut_in_the_last_line, "is not JSON"),
        (_cut_to_nothing, "a checkpoint says it held"),
    ],
    ids=["mid-line", "at-a-line-end", "last-line-gone", "in-the-last-line", "empty"],
)
def test_an_export_cut_anywhere_fails_verify_by_the_recipe(served, cli, tmp_path, cut, words):
    export, checkpoint, key = _recipe(served, tmp_path)
    export.write_bytes(cut(export.read_bytes()))
    result = _verify(cli, export, checkpoint, key)
    assert result.exit_code == 1, result.output
    assert words in result.output


@contextmanager
def _unreadable(database_url: str, tenant: Tenant, seq: int) -> Iterator[None]:
    """SQLite: entry ``seq``'s stored parameters are text that is not JSON, which reading it
    fails on (the export reads the file's text as it goes), then put back. The append-only
    guard is taken away for each change and put back as it was: the database is the run's."""
    engine = create_engine(database_url)
    where = {"w": tenant.id, "s": seq}
    select_ = "SELECT parameters FROM audit_log WHERE workspace_id = :w AND seq = :s"
    with engine.connect() as connection:
        stored = connection.execute(text(select_), where).scalar_one()
    _rewrite(engine, where, "{not json")
    try:
        yield
    finally:
        _rewrite(engine, where, stored)
        engine.dispose()


def _rewrite(engine: Any, where: dict[str, Any], parameters: str) -> None:
    with engine.begin() as connection:
        guard = connection.execute(
            text("SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = :n"),
            {"n": "audit_log_no_update"},
        ).scalar_one()
        connection.execute(text("DROP TRIGGER audit_log_no_update"))
        connection.execute(
            text("UPDATE audit_log SET parameters = :p WHERE workspace_id = :w AND seq = :s"),
            {**where, "p": parameters},
        )
        connection.execute(text(guard))


def _end_the_export_s_connection(database_url: str) -> int:
    """PostgreSQL: end the server's connection that reads the export (its cursor's FETCH),
    found by the application name this run's URL gives each of its connections."""
    name = parse_qs(urlsplit(database_url).query)["application_name"][0]
    with psycopg.connect(database_url) as db:
        ended = db.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = %s AND query LIKE 'FETCH%%' AND pid <> pg_backend_pid()",
            (name,),
        ).fetchone()
    assert ended is not None
    return int(ended[0])


def _take_a_failing_export(base: str, headers: dict[str, str], postgres: str | None) -> bytes:
    """What a client receives of an export that fails part-way; it must see no terminating
    chunk. On PostgreSQL the failure is the export's connection ended once the export is under
    way (it waits for its reader then: the client has read one chunk of 20 MB)."""
    received = bytearray()
    with httpx.stream(
        "GET", base + "/v1/audit-logs/export", params={"format": "jsonl"}, headers=headers,
        timeout=HANG_GUARD,
    ) as answer:  # fmt: skip
        assert answer.status_code == 200
        chunks = answer.iter_raw()
        received += next(chunks)
        if postgres is not None:
            assert _end_the_export_s_connection(postgres) == 1
        with pytest.raises(httpx.RemoteProtocolError):  # cut, not whole
            _take(chunks, received)
    return bytes(received)


def _take(chunks: Iterator[bytes], into: bytearray) -> None:
    """Every chunk into ``into``, as it comes, until the answer ends or breaks."""
    for chunk in chunks:
        into += chunk


@pytest.mark.slow
def test_a_failure_part_way_aborts_the_answer_after_a_line_that_is_not_json(
    served, database_url, cli, tmp_path
):
    base, headers, _spool = served
    postgres = database_url.startswith("postgresql")
    with ExitStack() as stack:
        if not postgres:  # a workspace of its own, with an entry that cannot be read half-way
            app = create_app(Settings(database_url=database_url))
            tenant = Tenant(app, f"broken-{secrets.token_hex(4)}", FakeClock())
            headers = _fill(app, tenant, 5000)
            app.extensions["agentauth"].close()
            stack.enter_context(_unreadable(database_url, tenant, 4001))
        received = _take_a_failing_export(base, headers, database_url if postgres else None)
    # the line whole (its newline may be cut: the abort may come first), after a whole line
    assert received.rstrip(b"\n").endswith(b"\n" + FAILED_LINE.rstrip(b"\n"))
    saved = tmp_path / "partial.jsonl"
    saved.write_bytes(received)
    result = cli("audit", "verify", "--export", saved, db=False)
    assert result.exit_code == 1, result.output
    assert "is not JSON" in result.output
