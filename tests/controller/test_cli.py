"""The command line's contract: exact output other tools rely on, clear errors, exit codes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from api import create_app
from controller.cli import main
from core.config import Settings
from tests.conftest import bearer
from tests.server import running_server


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def _create_key(runner, database_url, *args):
    arguments = ["keys", "create", "--name", "ci", "--db", database_url, *args]
    return runner.invoke(main, arguments, catch_exceptions=False)


def test_keys_create_prints_only_a_working_key(runner, database_url):
    result = _create_key(runner, database_url, "--scopes", "admin")
    assert result.exit_code == 0
    assert re.fullmatch(r"svc_[0-9a-f]{32}\n", result.output)
    client = create_app(Settings(database_url=database_url)).test_client()
    response = client.post("/v1/agents", json={"name": "x"}, headers=bearer(result.output.strip()))
    assert response.status_code == 201


def test_keys_in_a_new_workspace_see_only_that_workspace(runner, database_url):
    first = _create_key(runner, database_url, "--scopes", "admin", "--workspace", "cli-a").output
    second = _create_key(runner, database_url, "--scopes", "admin", "--workspace", "cli-b").output
    client = create_app(Settings(database_url=database_url)).test_client()
    made = client.post("/v1/agents", json={"name": "x"}, headers=bearer(first.strip())).json
    assert client.get(f"/v1/agents/{made['id']}", headers=bearer(second.strip())).status_code == 404


def test_read_only_key_from_the_cli_cannot_mutate(runner, database_url):
    key = _create_key(runner, database_url, "--scopes", "read-only").output.strip()
    client = create_app(Settings(database_url=database_url)).test_client()
    assert client.get("/v1/agents", headers=bearer(key)).status_code == 200
    response = client.post("/v1/agents", json={"name": "x"}, headers=bearer(key))
    assert response.status_code == 403


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--scopes", "root"], "admin, approver, read-only"),
        (["--scopes", "admin,admin"], "no repeats"),
        (["--scopes", ""], "admin, approver, read-only"),
        (["--scopes", "admin", "--expires-at", "yesterday"], "ISO 8601"),
        (["--scopes", "admin", "--expires-at", "2020-01-01T00:00:00Z"], "in the future"),
    ],
    ids=["unknown-scope", "repeated-scope", "no-scope", "bad-date", "past-date"],
)
def test_keys_create_refuses_bad_input_with_exit_2(runner, database_url, args, complaint):
    result = _create_key(runner, database_url, *args)
    assert result.exit_code == 2
    assert complaint in result.output
    assert "svc_" not in result.output


def test_database_url_from_the_environment(runner, tmp_path):
    url = f"sqlite:///{tmp_path / 'env.db'}"
    result = runner.invoke(main, ["db", "upgrade"], env={"AGENTAUTH_DATABASE_URL": url})
    assert result.exit_code == 0, result.output
    assert (tmp_path / "env.db").exists()


def test_default_database_is_agentauth_db_in_the_working_directory(runner, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(main, ["db", "upgrade"], env={"AGENTAUTH_DATABASE_URL": ""})
    assert result.exit_code == 0, result.output
    assert (tmp_path / "agentauth.db").exists()


def test_unusable_database_url_is_a_clear_error(runner):
    result = runner.invoke(main, ["db", "upgrade", "--db", "mysql://nobody@127.0.0.1/x"])
    assert result.exit_code == 1
    assert "sqlite" in result.output
    assert "postgresql" in result.output


def test_invalid_rate_limit_setting_is_a_clear_error(runner, database_url):
    result = runner.invoke(
        main,
        ["db", "upgrade", "--db", database_url],
        env={"AGENTAUTH_RATE_LIMIT_PER_MINUTE": "lots"},
    )
    assert result.exit_code == 1
    assert "AGENTAUTH_RATE_LIMIT_PER_MINUTE" in result.output


@pytest.mark.slow
def test_serve_prints_its_base_url_and_serves_with_granian(database_url):
    with running_server(database_url, workers=1) as base:
        response = httpx.get(base + "/healthz")
        assert response.status_code == 200
        assert response.headers["Server"] == "granian"


def test_the_service_verbs_join_even_beside_a_stale_egg_info(tmp_path):
    """serve, keys and db come from api.cli through entry points; an old ``*.egg-info`` in the
    working directory (left by an earlier install) must not hide them."""
    stale = tmp_path / "agentauth.egg-info"
    stale.mkdir()
    (stale / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: agentauth\nVersion: 0.0.1\n")
    (stale / "entry_points.txt").write_text("[console_scripts]\nagentauth = controller.cli:main\n")
    result = subprocess.run(
        [sys.executable, "-m", "controller", "--help"],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert result.returncode == 0, result.stderr
    listed = {line.split()[0] for line in result.stdout.splitlines() if line.startswith("  ")}
    assert {"serve", "keys", "db", "apply", "plan"} <= listed


def test_console_script_is_installed():
    result = subprocess.run(
        [sys.executable, "-m", "controller", "--help"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0
    for verb in ("serve", "keys", "db"):
        assert verb in result.stdout
