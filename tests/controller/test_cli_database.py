"""Opening the database, as the command line reports it: verbs that only read refuse a database
that is missing or not migrated and create nothing; every failure names the database (never its
password), says why and, where it can, what to do."""

from __future__ import annotations

import os
import re
import secrets
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from click.testing import Result
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import make_url

from core.config import Settings
from core.store.database import Database, normalize_url
from core.store.migrate import head_revision, upgrade
from tests.conftest import PG_ENV
from tests.controller.conftest import agent_doc, write_files
from tests.server import free_port, kill_session, session_members

Cli = Callable[..., Result]
PASSWORD = "s3cret-Pa55"
SERVE_SECONDS = 60  # a hang guard for serve's exit, never a measure of speed

# verbs whose whole job is reading the database (the others create and migrate it)
READ_ONLY_VERBS = [pytest.param(["plan", "{repo}"], id="plan")]
VERBS = [
    pytest.param(["db", "upgrade"], id="db-upgrade"),
    pytest.param(["keys", "create", "--name", "ci", "--scopes", "admin"], id="keys-create"),
    pytest.param(["plan", "{repo}"], id="plan"),
    pytest.param(["apply", "{repo}"], id="apply"),
]


def _run(cli: Cli, verb: list[str], repo: Path, url: str) -> Result:
    return cli(*[part.format(repo=repo) for part in verb], "--db", url, db=False)


def _closed_port_url() -> tuple[str, str]:
    """A PostgreSQL URL with a password, on a loopback port nothing listens on; and how our
    messages show it."""
    port = free_port()
    return (
        f"postgresql://agent:{PASSWORD}@127.0.0.1:{port}/agentauth",
        f"postgresql://agent:***@127.0.0.1:{port}/agentauth",
    )


def _unopenable(kind: str, tmp_path: Path) -> tuple[str, str, str]:
    """(URL, URL as shown, a reason of our own words expected after it) for a database that
    cannot be opened."""
    if kind == "missing-folder":
        folder = tmp_path / "no-such-folder"
        url = f"sqlite:///{folder / 'agentauth.db'}"
        return url, url, f"(the folder {folder} does not exist)"
    if kind == "not-a-database":
        path = tmp_path / "notes.db"
        path.write_text("these are notes, not a database\n" * 100)
        url = f"sqlite:///{path}"
        return url, url, ""
    url, shown = _closed_port_url()
    return url, shown, ""


def _assert_no_password(output: str) -> None:
    assert PASSWORD not in output
    assert quote(PASSWORD) not in output


# ----------------------------------------------- verbs that only read refuse, creating nothing


@pytest.mark.parametrize("verb", READ_ONLY_VERBS)
@pytest.mark.parametrize("folder", ["", "no-such-folder/"], ids=["missing-file", "missing-folder"])
def test_read_only_verbs_refuse_a_missing_sqlite_file_and_create_nothing(
    cli, repo_dir, tmp_path, verb, folder
):
    path = tmp_path / f"{folder}typo.db"
    url = f"sqlite:///{path}"
    result = _run(cli, verb, repo_dir, url)
    assert result.exit_code == 1
    assert f"error: the database {url} does not exist" in result.output
    assert f"agentauth db upgrade --db {url}" in result.output
    assert not path.exists()
    assert not path.parent.exists() or list(path.parent.glob("typo.db*")) == []


@pytest.fixture
def schemaless_url(tmp_path: Path) -> Iterator[str]:
    """A database that exists, with no agentauth schema: a SQLite file holding a table of
    someone else's, or an empty PostgreSQL schema when the suite runs on PostgreSQL."""
    base = os.environ.get(PG_ENV)
    if not base:
        path = tmp_path / "other.db"
        with sqlite3.connect(path) as connection:
            connection.execute("CREATE TABLE notes (body TEXT)")
        connection.close()
        yield f"sqlite:///{path}"
        return
    schema = f"agentauth_empty_{secrets.token_hex(4)}"
    admin = create_engine(normalize_url(base))
    with admin.begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    separator = "&" if "?" in base else "?"
    try:
        yield f"{base}{separator}options={quote(f'-csearch_path={schema}')}"
    finally:
        with admin.begin() as connection:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def _tables(url: str) -> set[str]:
    engine = create_engine(normalize_url(url))
    try:
        with engine.connect() as connection:
            return set(inspect(connection).get_table_names())
    finally:
        engine.dispose()


def _shown(url: str) -> str:
    """How a URL without a password is shown: as given."""
    return make_url(url).render_as_string()


@pytest.mark.parametrize("verb", READ_ONLY_VERBS)
def test_read_only_verbs_refuse_a_database_never_migrated_and_leave_it_as_it_was(
    cli, repo_dir, schemaless_url, verb
):
    before = _tables(schemaless_url)
    result = _run(cli, verb, repo_dir, schemaless_url)
    assert result.exit_code == 1
    shown = _shown(schemaless_url)
    assert f"error: the database {shown} has no agentauth schema" in result.output
    assert f"agentauth db upgrade --db {shown}" in result.output
    assert _tables(schemaless_url) == before


@pytest.mark.parametrize("verb", READ_ONLY_VERBS)
def test_read_only_verbs_refuse_a_schema_behind_until_db_upgrade_runs(
    cli, repo_dir, schemaless_url, verb
):
    database = Database(Settings(database_url=schemaless_url))
    upgrade(database, "0001")
    database.dispose()
    result = _run(cli, verb, repo_dir, schemaless_url)
    assert result.exit_code == 1
    shown = _shown(schemaless_url)
    assert f"error: the database {shown} has schema revision 0001" in result.output
    assert f"needs {head_revision()}" in result.output
    assert f"agentauth db upgrade --db {shown}" in result.output
    assert _run(cli, ["db", "upgrade"], repo_dir, schemaless_url).exit_code == 0
    assert _run(cli, verb, repo_dir, schemaless_url).exit_code == 0


@pytest.mark.parametrize("verb", VERBS)
def test_a_schema_newer_than_this_version_is_refused_by_every_verb(
    cli, repo_dir, schemaless_url, verb
):
    database = Database(Settings(database_url=schemaless_url))
    upgrade(database)
    with database.transaction(write=True) as session:
        session.execute(text("UPDATE alembic_version SET version_num = '9999_future'"))
    database.dispose()
    result = _run(cli, verb, repo_dir, schemaless_url)
    assert result.exit_code == 1
    shown = _shown(schemaless_url)
    assert f"error: the database {shown} has schema revision 9999_future" in result.output
    assert "upgrade agentauth" in result.output


def test_verbs_that_write_still_create_and_migrate_a_missing_database(cli, repo_dir, tmp_path):
    write_files(repo_dir, {"agents/support.yaml": agent_doc("support-agent")})
    path = tmp_path / "new.db"
    assert _run(cli, ["apply", "{repo}"], repo_dir, f"sqlite:///{path}").exit_code == 0
    assert _run(cli, ["plan", "{repo}"], repo_dir, f"sqlite:///{path}").exit_code == 0


# ------------------------------------- a database that cannot be opened: which one, and why

UNOPENABLE = ["missing-folder", "not-a-database", "postgresql-closed-port"]


@pytest.mark.parametrize("verb", VERBS)
@pytest.mark.parametrize("kind", UNOPENABLE)
def test_a_database_that_cannot_be_opened_is_named_with_the_reason(
    cli, repo_dir, tmp_path, kind, verb
):
    url, shown, ours = _unopenable(kind, tmp_path)
    result = _run(cli, verb, repo_dir, url)
    assert result.exit_code == 1
    if kind == "missing-folder" and verb[0] == "plan":  # it only reads: nothing to open
        assert f"error: the database {shown} does not exist" in result.output
    else:
        # what follows our words is the driver's reason, whose wording is the driver's
        assert re.search(rf"error: cannot open the database {re.escape(shown)}: \S", result.output)
        assert ours in result.output
    _assert_no_password(result.output)
    assert "Traceback" not in result.output


@pytest.mark.parametrize("kind", UNOPENABLE)
def test_serve_reports_a_database_it_cannot_open_and_exits_before_serving(tmp_path, kind):
    url, shown, ours = _unopenable(kind, tmp_path)
    command = [sys.executable, "-m", "controller", "serve", "--port", str(free_port())]
    process = subprocess.Popen(
        [*command, "--db", url, "--workers", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # so whatever it might fork can be found, and killed, by session
    )
    try:
        out, err = process.communicate(timeout=SERVE_SECONDS)
    except subprocess.TimeoutExpired:
        kill_session(process)
        pytest.fail(f"serve still running after {SERVE_SECONDS} s")
    assert process.returncode == 1
    assert f"error: cannot open the database {shown}: " in err
    assert ours in err
    assert "serving on" not in out
    _assert_no_password(out + err)
    assert session_members(process.pid) == []


@pytest.mark.skipif(not os.environ.get(PG_ENV), reason="needs a PostgreSQL server")
@pytest.mark.parametrize("verb", VERBS)
def test_a_password_the_server_repeats_is_not_shown(cli, repo_dir, verb):
    """The server names the database it lacks: here that name is the password."""
    base = make_url(os.environ[PG_ENV])
    url = base.set(password=PASSWORD, database=PASSWORD).render_as_string(hide_password=False)
    result = _run(cli, verb, repo_dir, url)
    assert result.exit_code == 1
    assert f"error: cannot open the database postgresql://{base.username}:***@" in result.output
    _assert_no_password(result.output)
