"""What the tests of the verifiable audit log (decisions §7) share: a database of a test's own
(a SQLite file, or a PostgreSQL schema when the run is on PostgreSQL), migrated to any revision;
``agentauth audit`` run as a user runs it (click's runner, the real command line); and
:class:`AuditLog`, one workspace's log as its user sees it: decisions through the API, the JSONL
export, checkpoints, the public key, and ``agentauth audit verify`` against the database and
against an export.

Tampering is done by the tests themselves, in SQL, as whoever holds the database would: see
:meth:`AuditLog.as_superuser`, which first takes the append-only guards away (so it is only used
on a database of the test's own, which nobody else needs guarded).
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result
from flask import Flask
from sqlalchemy import text
from sqlalchemy.orm import Session

from controller.cli import main
from core.store.database import Database
from core.store.migrate import upgrade
from tests.api.helpers import decide, make_agent
from tests.conftest import PG_ENV, Tenant, postgresql_schema

ALLOW_CALENDAR = [{"type": "tool_allowlist", "tools": ["calendar.*"]}]


# ------------------------------------------------------------------ a database of a test's own


@contextmanager
def fresh_database(directory: Path, revision: str = "head") -> Iterator[str]:
    """The URL of a new database migrated to ``revision``: a SQLite file in ``directory``, or
    (when the run is on PostgreSQL) a schema of its own, dropped at the end."""
    from core.config import Settings

    token = secrets.token_hex(4)
    base = os.environ.get(PG_ENV)
    if not base:
        url = f"sqlite:///{directory / f'chain-{token}.db'}"
        _migrate(Settings(database_url=url), revision)
        yield url
        return
    with postgresql_schema(base, "agentauth_chain") as url:
        _migrate(Settings(database_url=url), revision)
        yield url


def _migrate(settings: Any, revision: str) -> None:
    db = Database(settings)
    try:
        upgrade(db, revision)
    finally:
        db.dispose()


# ------------------------------------------------------------------------- the command line


def audit_cli(key_file: str, *args: Any) -> Result:
    """``agentauth audit ARGS`` with the run's signing key file (as the servers have it)."""
    env = {"AGENTAUTH_AUDIT_KEY_FILE": key_file, "AGENTAUTH_AUDIT_KEY": None, "NO_COLOR": "1"}
    return CliRunner().invoke(
        main, ["audit", *(str(a) for a in args)], env=env, catch_exceptions=False
    )


@dataclass(frozen=True)
class Verdict:
    """What ``agentauth audit verify --format json`` said, and its exit code."""

    code: int
    report: dict[str, Any]

    @property
    def failure(self) -> tuple[int, str] | None:
        """(seq, what) of the first failure, as the report names it."""
        failure = self.report["failure"]
        return None if failure is None else (failure["seq"], failure["what"])


def verify(key_file: str, *args: Any) -> Verdict:
    """``agentauth audit verify ARGS --format json``: exit 0 or 1 and its JSON report."""
    result = audit_cli(key_file, "verify", *args, "--format", "json")
    assert result.exit_code in (0, 1), (result.exit_code, result.output)
    report = json.loads(result.stdout)
    assert report["ok"] is (result.exit_code == 0), report
    return Verdict(result.exit_code, report)


def failed_at(verdict: Verdict, seq: int, what: str) -> bool:
    """Exit 1, naming ``seq`` and ``what`` as the first failure."""
    return verdict.code == 1 and verdict.failure == (seq, what)


# ------------------------------------------------------------------- one workspace's log


def jsonl(body: bytes) -> list[dict[str, Any]]:
    """An export's lines, each a JSON object (the body ends with a newline, or is empty)."""
    assert body == b"" or body.endswith(b"\n"), body[-100:]
    return [json.loads(line) for line in body.splitlines()]


@dataclass
class AuditLog:
    """One workspace's audit log on ``database_url``, as its user reaches it."""

    app: Flask
    workspace: Tenant
    database_url: str
    key_file: str
    folder: Path
    headers: dict[str, str] = field(init=False)
    agent: str = field(init=False)

    def __post_init__(self) -> None:
        self.headers = self.workspace.headers("admin")
        self.client = self.app.test_client()
        self.agent = make_agent(self.client, self.headers, "calendar", ALLOW_CALENDAR)
        self._files = 0
        self.app.extensions["agentauth"].audit_key()  # made on first use, as serve does at start

    @property
    def db(self) -> Database:
        return self.app.extensions["agentauth"].db  # type: ignore[no-any-return]

    def decide(
        self, count: int, agent: str | None = None, tool: str = "calendar.read"
    ) -> list[str]:
        """``count`` decisions (allowed, with parameters telling them apart); their audit ids."""
        return [
            decide(self.client, self.headers, agent or self.agent, tool, n=i, note=f"call {i}")[
                "auditId"
            ]
            for i in range(count)
        ]

    def export_body(self, **query: Any) -> bytes:
        response = self.client.get(
            "/v1/audit-logs/export",
            query_string={"format": "jsonl", **query},
            headers=self.headers,
        )
        assert response.status_code == 200, response.get_data(as_text=True)
        assert response.mimetype == "application/jsonl"
        return bytes(response.get_data())

    def export(self, **query: Any) -> list[dict[str, Any]]:
        return jsonl(self.export_body(**query))

    def file(self, name: str, content: str | bytes) -> Path:
        """``content`` in a file of this log's folder (a new name each time)."""
        self._files += 1
        path = self.folder / f"{self._files}-{name}"
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
        return path

    def export_file(self) -> Path:
        return self.file("log.jsonl", self.export_body())

    def public_key_file(self) -> Path:
        response = self.client.get("/v1/audit-logs/public-key", headers=self.headers)
        assert response.status_code == 200
        return self.file("agentauth.pub", response.get_data(as_text=True))

    def checkpoint_note(self) -> str:
        response = self.client.get("/v1/audit-logs/checkpoint", headers=self.headers)
        assert response.status_code == 200, response.get_data(as_text=True)
        return str(response.get_data(as_text=True))

    def checkpoint_file(self) -> Path:
        """``agentauth audit checkpoint --out FILE`` of this workspace, now: FILE."""
        path = self.folder / f"checkpoints-{secrets.token_hex(3)}"
        result = self.cli("checkpoint", "--db", self.database_url, "--out", path, workspace=True)
        assert result.exit_code == 0, result.output
        return path

    def cli(self, *args: Any, workspace: bool = False) -> Result:
        extra = ["--workspace", self.workspace.name] if workspace else []
        return audit_cli(self.key_file, *args, *extra)

    def verify_db(self, *checkpoints: Path) -> Verdict:
        """``agentauth audit verify --db URL --workspace NAME [--checkpoint FILE ...]``."""
        flags = [flag for path in checkpoints for flag in ("--checkpoint", path)]
        return verify(
            self.key_file, "--db", self.database_url, "--workspace", self.workspace.name, *flags
        )

    def verify_export(self, *checkpoints: Path, export: Path | None = None) -> Verdict:
        """``agentauth audit verify --export FILE`` of an export taken now (or ``export``), with
        the public key the API answers when checkpoints are given."""
        flags = [flag for path in checkpoints for flag in ("--checkpoint", path)]
        if checkpoints:
            flags += ["--public-key", self.public_key_file()]
        return verify(self.key_file, "--export", export or self.export_file(), *flags)

    def verdicts(self, *checkpoints: Path) -> tuple[Verdict, Verdict]:
        """What verify says of the database and of an export of it, with ``checkpoints``."""
        return self.verify_db(*checkpoints), self.verify_export(*checkpoints)

    @contextmanager
    def as_superuser(self) -> Iterator[Session]:
        """A transaction of whoever holds the database, the append-only guards taken away as
        they would take them (SQLite: DROP TRIGGER; PostgreSQL: DISABLE TRIGGER)."""
        with self.db.transaction(write=True) as session:
            if self.db.is_sqlite:
                session.execute(text("DROP TRIGGER IF EXISTS audit_log_no_update"))
                session.execute(text("DROP TRIGGER IF EXISTS audit_log_no_delete"))
            else:
                session.execute(text("ALTER TABLE audit_log DISABLE TRIGGER audit_log_append_only"))
            yield session


@contextmanager
def audit_log_of_its_own(folder: Path, key_file: str, clock: Any, name: str) -> Iterator[AuditLog]:
    """A workspace ``name-<random>``'s log on a database of the test's own (a test that tampers
    may take its guards away), with one agent allowed calendar.*; the app closed after."""
    from api import create_app
    from core.config import Settings

    with fresh_database(folder) as url:
        app = create_app(Settings(database_url=url, audit_key_file=key_file), clock=clock)
        try:
            tenant = Tenant(app, f"{name}-{secrets.token_hex(4)}", clock)
            yield AuditLog(app, tenant, url, key_file, folder)
        finally:
            app.extensions["agentauth"].close()
