"""Fixtures, each building on the last: database_url -> settings -> app -> client -> workspace
-> admin_headers.

The suite runs on SQLite by default and on PostgreSQL when ``AGENTAUTH_TEST_DATABASE_URL`` is
set. Each run gets a fresh SQLite file or a fresh PostgreSQL schema (dropped at the end), migrated
once; each test gets its own workspace, which isolates it as completely as the API isolates
tenants.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from click.testing import CliRunner, Result
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import settings as hypothesis_settings
from sqlalchemy import create_engine, text

from api import create_app
from core.config import Settings
from core.domain import ids
from core.store.database import Database, normalize_url
from core.store.keys import ensure_workspace, issue_key
from core.store.migrate import upgrade

PG_ENV = "AGENTAUTH_TEST_DATABASE_URL"
# Hypothesis fails an example that takes over 200 ms by default: a timing threshold, which a
# loaded CI machine trips on correct code. Properties are checked, never speed (see bench/).
hypothesis_settings.register_profile("agentauth", deadline=None)
hypothesis_settings.load_profile("agentauth")
#: fails the run if an API key shows up in any body, log, export or stored row (see the module)
pytest_plugins = ["tests.secrets_scan"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        help="rewrite the golden files (tests/controller/golden) from the current output",
    )


def pytest_report_header() -> str:
    return "database: " + ("postgresql (" + PG_ENV + ")" if os.environ.get(PG_ENV) else "sqlite")


@pytest.fixture(scope="session")
def database_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A freshly migrated database for this run."""
    base = os.environ.get(PG_ENV)
    if not base:
        url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'agentauth.db'}"
        _migrate(url)
        yield url
        _scan_database(url)
        return
    with postgresql_schema(base, "agentauth_test") as url:
        _migrate(url)
        yield url
        _scan_database(normalize_url(url))


@contextmanager
def postgresql_schema(base: str, prefix: str) -> Iterator[str]:
    """The URL of a new, empty schema of the PostgreSQL at ``base`` (every connection made
    with it works in that schema and names it as its application), dropped at the end."""
    schema = f"{prefix}_{os.getpid()}_{secrets.token_hex(4)}"
    admin = create_engine(normalize_url(base))
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    separator = "&" if "?" in base else "?"
    url = f"{base}{separator}options={quote(f'-csearch_path={schema}')}&application_name={schema}"
    try:
        yield url
    finally:
        with admin.begin() as conn:
            # a connection left open (a server killed mid-test) must not block the drop
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE application_name = :name AND pid <> pg_backend_pid()"
                ),
                {"name": schema},
            )
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def _scan_database(url: str) -> None:
    from tests.secrets_scan import scan_database  # the plugin, loaded by then

    scan_database(url)


def _migrate(url: str) -> None:
    db = Database(Settings(database_url=url))
    upgrade(db)
    db.dispose()


@dataclass
class FakeClock:
    """A clock tests control. Each reading moves it on by ``step`` so orderings by time stay
    strict, like a real clock's."""

    moment: datetime = field(default_factory=lambda: datetime(2026, 11, 21, 12, 0, tzinfo=UTC))
    step: timedelta = timedelta(milliseconds=1)

    def __call__(self) -> datetime:
        self.moment += self.step
        return self.moment

    def advance(self, seconds: float) -> None:
        self.moment += timedelta(seconds=seconds)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def settings(database_url: str, audit_key_file: str) -> Settings:
    return Settings(
        database_url=database_url, rate_limit_per_minute=100_000, audit_key_file=audit_key_file
    )


@pytest.fixture(scope="session", autouse=True)
def audit_key_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Where the run's audit signing key is made, on first use; servers and commands the tests
    start find it through the environment, so no test writes the tester's own key file."""
    path = str(tmp_path_factory.mktemp("keys") / "audit.key")
    before = os.environ.get("AGENTAUTH_AUDIT_KEY_FILE")
    os.environ["AGENTAUTH_AUDIT_KEY_FILE"] = path
    yield path
    if before is None:
        os.environ.pop("AGENTAUTH_AUDIT_KEY_FILE", None)
    else:
        os.environ["AGENTAUTH_AUDIT_KEY_FILE"] = before


@pytest.fixture
def app(settings: Settings, clock: FakeClock) -> Iterator[Flask]:
    app = create_app(settings, clock=clock)
    yield app
    app.extensions["agentauth"].close()


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


@dataclass
class Tenant:
    """A workspace of the test's own, and a way to mint keys in it."""

    app: Flask
    name: str
    clock: FakeClock

    @property
    def id(self) -> str:
        return ids.workspace_id(self.name)

    def key(self, *scopes: str, expires_at: datetime | None = None) -> str:
        db: Database = self.app.extensions["agentauth"].db
        with db.transaction(write=True) as session:
            wid = ensure_workspace(session, self.name, self.clock.moment)
            _, key = issue_key(session, wid, "test", list(scopes), expires_at, self.clock.moment)
        from tests.secrets_scan import note_issued_key  # the plugin, loaded by then

        note_issued_key(key)
        return key

    def headers(self, *scopes: str, expires_at: datetime | None = None) -> dict[str, str]:
        return bearer(self.key(*scopes, expires_at=expires_at))


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def workspace(app: Flask, clock: FakeClock) -> Tenant:
    return Tenant(app, f"ws-{secrets.token_hex(6)}", clock)


@pytest.fixture
def other_workspace(app: Flask, clock: FakeClock) -> Tenant:
    return Tenant(app, f"other-{secrets.token_hex(6)}", clock)


@pytest.fixture
def admin_headers(workspace: Tenant) -> dict[str, str]:
    return workspace.headers("admin")


@pytest.fixture
def readonly_headers(workspace: Tenant) -> dict[str, str]:
    return workspace.headers("read-only")


@pytest.fixture
def cli(database_url: str, tmp_path: Path) -> Callable[..., Result]:
    """Run ``agentauth ARGS`` against this run's database (``--db`` added where it applies)."""
    from controller.cli import main

    runner = CliRunner()
    env = {"AGENTAUTH_CACHE_DIR": str(tmp_path / "cache"), "NO_COLOR": "1"}

    def run(*args: Any, db: bool = True) -> Result:
        arguments = [str(a) for a in args] + (["--db", database_url] if db else [])
        return runner.invoke(main, arguments, env=env, catch_exceptions=False)

    return run
