"""The service's own verbs of the ``agentauth`` command: ``serve``, ``keys create`` and ``db
upgrade``. They join the controller's verbs through the ``agentauth.commands`` entry points
(setup.cfg), so neither package imports the other.

``serve --repo`` runs the controller as a program of its own: ``agentauth watch DIR --once``
applies the repository before the server starts, and with ``--watch`` a second child keeps
applying saved changes while it serves (a child process: the server's master forks its
workers, so it must not run threads of its own).
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import NoReturn

import click

from core.config import DATABASE_URL_HELP, Settings
from core.domain.clock import parse_instant, utc_now
from core.domain.errors import AgentAuthError, ValidationError
from core.domain.validation import require_name
from core.store import signing
from core.store.keys import Scope, ensure_workspace, issue_key
from core.store.migrate import open_database

#: the workspace ``serve --repo`` applies to
SERVED_WORKSPACE = "default"


def _fail(error: AgentAuthError) -> NoReturn:
    click.echo(f"error: {error.message}", err=True)
    sys.exit(1)


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535))
@click.option("--db", help=DATABASE_URL_HELP)
@click.option(
    "--workers",
    type=click.IntRange(1, 64),
    help="worker processes  [default: one per processor this process may run on]",
)
@click.option(
    "--threads",
    default=4,
    show_default=True,
    type=click.IntRange(1, 64),
    help="threads per worker process that run the API (authorize runs on the event loop)",
)
@click.option(
    "--repo",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="a policy repository to apply to the default workspace before serving",
)
@click.option("--watch", is_flag=True, help="with --repo: apply it again whenever a file is saved")
def serve(
    host: str,
    port: int,
    db: str | None,
    workers: int | None,
    threads: int,
    repo: Path | None,
    watch: bool,
) -> None:
    """Bring the schema up to date, apply --repo if given, then serve the API."""
    from api.server import serve as run_server

    if watch and repo is None:
        raise click.UsageError("--watch needs --repo")
    try:
        settings = Settings.from_env(database_url=db)
        open_database(settings, write=True).dispose()
        signing.load_or_create(settings)  # the audit signing key: made on first start
    except AgentAuthError as exc:
        _fail(exc)
    if repo is not None:
        _apply_before_serving(repo, settings)
    if workers is None:
        workers = default_workers()
    click.echo(
        f"agentauth serving on http://{host}:{port} "
        f"({workers} worker processes x {threads} threads; {usable_processors()} processors "
        "usable)",
        err=False,
    )
    sys.stdout.flush()
    watcher = Controller(["watch", str(repo)], settings) if watch and repo else None
    try:
        run_server(settings, host, port, workers, threads)
    finally:
        if watcher is not None:
            watcher.stop()


def default_workers() -> int:
    """One worker process per processor this process may run on (a container's CPU set, not
    the host's count): the app runs Python, one processor per process at a time, and each
    worker's threads mostly wait for the database (bench/RESULTS.md, #21)."""
    return min(64, usable_processors())


def usable_processors() -> int:
    return max(1, len(os.sched_getaffinity(0)))


def _apply_before_serving(directory: Path, settings: Settings) -> None:
    """Apply once. A repository that fails is reported and the service starts anyway, serving
    the last applied state: a bad policy commit must not take it down."""
    applied = Controller(["watch", str(directory), "--once"], settings).wait()
    if applied != 0:
        click.echo("the last applied policies stay in force", err=True)


class Controller:
    """``agentauth <verb> ... --workspace default`` as a child process sharing this one's
    output, stopped with it.

    The database URL goes to the child in its environment, not its command line, where every
    user of the machine could read a password in it."""

    def __init__(self, arguments: list[str], settings: Settings) -> None:
        self._owner = os.getpid()
        command = [
            sys.executable, "-m", "controller", *arguments, "--workspace", SERVED_WORKSPACE,
        ]  # fmt: skip
        environment = {**os.environ, "AGENTAUTH_DATABASE_URL": settings.database_url}
        sys.stdout.flush()
        # our own interpreter and module with a list of arguments: no shell, nothing to inject
        self.process = subprocess.Popen(command, env=environment, stdin=subprocess.DEVNULL)  # noqa: S603

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait(self) -> int:
        """Its exit status, once it has exited."""
        return self.process.wait()

    def stop(self, timeout: float = 20) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds. Does nothing in another process: a
        server worker forked from this one may leave through the frames it was forked from."""
        if os.getpid() != self._owner:
            return
        # Popen checks that the child is still its own (unreaped) before it signals the PID
        self.process.terminate()
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@click.group()
def keys() -> None:
    """Manage API keys."""


def _scopes(_ctx: click.Context, _param: click.Parameter, value: str) -> list[str]:
    scopes = [s.strip() for s in value.split(",") if s.strip()]
    known = {s.value for s in Scope}
    bad = [s for s in scopes if s not in known]
    if not scopes or bad or len(set(scopes)) != len(scopes):
        raise click.BadParameter(
            "a comma-separated list of admin, approver, read-only (no repeats)"
        )
    return scopes


def _name(_ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        return require_name(value, param.name or "name")
    except ValidationError as exc:
        raise click.BadParameter("; ".join(p.message for p in exc.problems)) from None


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
@click.option("--name", required=True, callback=_name, help="a label for the key")
@click.option(
    "--scopes", required=True, callback=_scopes, help="admin, approver, read-only, comma-separated"
)
@click.option(
    "--workspace", default="default", show_default=True, callback=_name, help="created on first use"
)
@click.option("--expires-at", callback=_instant, help="ISO 8601 expiry (default: never)")
@click.option("--db", help=DATABASE_URL_HELP)
def keys_create(
    name: str, scopes: list[str], workspace: str, expires_at: datetime | None, db: str | None
) -> None:
    """Create a key and print it (only the key, so KEY=$(agentauth keys create ...) works)."""
    try:
        database = open_database(Settings.from_env(database_url=db), write=True)
        now = utc_now()
        with database.transaction(write=True) as session:
            workspace_id = ensure_workspace(session, workspace, now)
            _, key = issue_key(session, workspace_id, name, scopes, expires_at, now)
        database.dispose()
    except AgentAuthError as exc:
        _fail(exc)
    click.echo(key)


@click.group()
def db() -> None:
    """Manage the database schema."""


@db.command("upgrade")
@click.option("--db", "url", help=DATABASE_URL_HELP)
def db_upgrade(url: str | None) -> None:
    """Apply every pending migration."""
    try:
        open_database(Settings.from_env(database_url=url), write=True).dispose()
    except AgentAuthError as exc:
        _fail(exc)
    click.echo("database schema is up to date")
