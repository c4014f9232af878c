"""The ``agentauth`` command: one click group, one function per verb.

Settings are built here, once, from flags and ``AGENTAUTH_*`` variables, and passed down.
"""

from __future__ import annotations

import sys
from datetime import datetime

import click

from core.clock import parse_instant, utc_now
from core.config import Settings
from core.db import Database
from core.db.migrate import upgrade
from core.errors import AgentAuthError
from core.keys import Scope, ensure_workspace, issue_key

DB_HELP = "database URL (default: $AGENTAUTH_DATABASE_URL, else sqlite:///agentauth.db)"


def _settings(db: str | None) -> Settings:
    return Settings.from_env(database_url=db)


def _fail(error: AgentAuthError) -> None:
    click.echo(f"error: {error.message}", err=True)
    sys.exit(1)


@click.group()
@click.version_option(package_name="agentauth")
def main() -> None:
    """agentauth: authorization for AI agents' tool calls, run as policy-as-code."""


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535))
@click.option("--db", help=DB_HELP)
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1, 64))
@click.option(
    "--threads",
    default=4,
    show_default=True,
    type=click.IntRange(1, 64),
    help="threads per worker process",
)
def serve(host: str, port: int, db: str | None, workers: int, threads: int) -> None:
    """Bring the schema up to date, then serve the API."""
    from api.server import serve as run_server

    try:
        settings = _settings(db)
        database = Database(settings)
        upgrade(database)
        database.dispose()
    except AgentAuthError as exc:
        _fail(exc)
    click.echo(f"agentauth serving on http://{host}:{port}", err=False)
    sys.stdout.flush()
    run_server(settings, host, port, workers, threads)


@main.group()
def keys() -> None:
    """Manage API keys."""


def _scopes(_ctx: click.Context, _param: click.Parameter, value: str) -> list[str]:
    scopes = [s.strip() for s in value.split(",") if s.strip()]
    known = {s.value for s in Scope}
    bad = [s for s in scopes if s not in known]
    if not scopes or bad or len(set(scopes)) != len(scopes):
        raise click.BadParameter("a comma-separated list of admin, read-only (no repeats)")
    return scopes


def _instant(_ctx: click.Context, _param: click.Parameter, value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        moment = parse_instant(value)
    except ValueError:
        raise click.BadParameter("an ISO 8601 date-time, e.g. 2027-01-31T00:00:00Z") from None
    if moment <= utc_now():
        raise click.BadParameter("must be in the future")
    return moment


@keys.command("create")
@click.option("--name", required=True, help="a label for the key")
@click.option("--scopes", required=True, callback=_scopes, help="admin, read-only or both")
@click.option("--workspace", default="default", show_default=True, help="created on first use")
@click.option("--expires-at", callback=_instant, help="ISO 8601 expiry (default: never)")
@click.option("--db", help=DB_HELP)
def keys_create(
    name: str, scopes: list[str], workspace: str, expires_at: datetime | None, db: str | None
) -> None:
    """Create a key and print it (only the key, so KEY=$(agentauth keys create ...) works)."""
    if not 1 <= len(name) <= 255:
        raise click.BadParameter("must be 1 to 255 characters", param_hint="--name")
    try:
        database = Database(_settings(db))
        upgrade(database)
        now = utc_now()
        with database.transaction(write=True) as session:
            workspace_id = ensure_workspace(session, workspace, now)
            _, key = issue_key(session, workspace_id, name, scopes, expires_at, now)
        database.dispose()
    except AgentAuthError as exc:
        _fail(exc)
    click.echo(key)


@main.group()
def db() -> None:
    """Manage the database schema."""


@db.command("upgrade")
@click.option("--db", "url", help=DB_HELP)
def db_upgrade(url: str | None) -> None:
    """Apply every pending migration."""
    try:
        database = Database(_settings(url))
        upgrade(database)
        database.dispose()
    except AgentAuthError as exc:
        _fail(exc)
    click.echo("database schema is up to date")
