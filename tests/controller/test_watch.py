"""watch and serve --repo as a user runs them: a real folder watched by watchdog, applied to the
real database of this run (SQLite or PostgreSQL). Tests wait on the watcher's results queue (or
on a child process's output), never on a sleep."""

from __future__ import annotations

import os
import queue
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import httpx
import pytest
from click.testing import CliRunner

from controller.apply import ApplyResult
from controller.cli import main
from controller.plan import LiveState
from controller.reconcile import apply_directory, describe_result
from controller.repo import load_repo
from controller.sources import read_files, revision_of
from controller.state import read_live
from controller.watch import Watcher, is_watched_path
from core.config import Settings
from core.domain import ids
from core.store.database import Database
from core.store.models import SyncStatus
from tests.controller.conftest import agent_doc, write_files
from tests.server import _wait_until_healthy, free_port, stop_server

WAIT = 20  # seconds a test waits for a result before it fails
RESULT_LINE = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ "  # a result the watch verb logs


def policy_doc(name: str, agent: str, tools: str = '["search.*"]', priority: int = 0) -> str:
    return f"""
    apiVersion: agentauth/v1
    kind: Policy
    metadata:
      name: {name}
    spec:
      agent: {agent}
      priority: {priority}
      rules:
        - type: tool_allowlist
          tools: {tools}
    """


BROKEN_POLICY = """
apiVersion: agentauth/v1
kind: Policy
metadata:
  name: search
spec:
  agent: bot
  colour: blue
  rules: []
"""


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(Settings(database_url=database_url))
    yield database
    database.dispose()


@pytest.fixture
def watcher(repo_dir: Path, db: Database, ws_name: str) -> Iterator[Watcher]:
    with Watcher(repo_dir, lambda: apply_directory(db, repo_dir, workspace=ws_name), 0.2) as w:
        results_until_current(w, repo_dir)  # the apply at start
        yield w


def results_until_current(watcher: Watcher, directory: Path) -> list[ApplyResult]:
    """Results off the queue up to the one for the folder as it is now (a save caught halfway
    may have been applied on the way)."""
    current = revision_of(directory, read_files(directory))
    results = [watcher.results.get(timeout=WAIT)]
    while results[-1].revision != current:
        results.append(watcher.results.get(timeout=WAIT))
    return results


def live(db: Database, workspace: str) -> LiveState:
    with db.transaction() as session:
        return read_live(session, ids.workspace_id(workspace))


def sync_status(db: Database, workspace: str) -> SyncStatus:
    with db.transaction() as session:
        status = session.get(SyncStatus, ids.workspace_id(workspace))
        assert status is not None
        session.expunge(status)
    return status


def tools_by_policy(db: Database, workspace: str) -> dict[str, list[str]]:
    return {p.name: p.fields["rules"][0]["tools"] for p in live(db, workspace).policies}


# ---------------------------------------------------------------------------------- Watcher


def test_saves_are_applied_and_a_broken_save_keeps_the_last_applied_state(
    watcher, repo_dir, db, ws_name
):
    write_files(
        repo_dir, {"agents/bot.yaml": agent_doc("bot"), "search.yaml": policy_doc("search", "bot")}
    )
    good = results_until_current(watcher, repo_dir)[-1]
    assert good.ok
    assert good.plan is not None
    assert good.plan.summary()["create"] == 2
    assert [a.name for a in live(db, ws_name).agents] == ["bot"]
    assert tools_by_policy(db, ws_name) == {"search": ["search.*"]}

    write_files(repo_dir, {"search.yaml": BROKEN_POLICY})
    bad = results_until_current(watcher, repo_dir)[-1]
    assert not bad.ok
    assert any(p.file == "search.yaml" and p.path == "spec.colour" for p in bad.problems)
    assert tools_by_policy(db, ws_name) == {"search": ["search.*"]}
    status = sync_status(db, ws_name)
    assert (status.result, status.attempted_revision) == ("failed", bad.revision)
    assert status.applied_revision == good.revision
    lines = describe_result(bad)
    assert "failed" in lines[0]
    assert any("search.yaml" in line for line in lines[1:])

    write_files(repo_dir, {"search.yaml": policy_doc("search", "bot", '["search.web"]')})
    fixed = results_until_current(watcher, repo_dir)[-1]
    assert fixed.ok
    assert tools_by_policy(db, ws_name) == {"search": ["search.web"]}
    assert sync_status(db, ws_name).applied_revision == fixed.revision


def test_deletes_and_an_editors_rename_into_place_are_applied(watcher, repo_dir, db, ws_name):
    write_files(
        repo_dir,
        {
            "bot.yaml": agent_doc("bot"),
            "one.yaml": policy_doc("one", "bot"),
            "two.yaml": policy_doc("two", "bot"),
        },
    )
    results_until_current(watcher, repo_dir)
    (repo_dir / "two.yaml").unlink()
    results_until_current(watcher, repo_dir)
    assert tools_by_policy(db, ws_name) == {"one": ["search.*"]}
    # save as a hidden temporary file, then rename over the original (vim, JetBrains, ...)
    write_files(repo_dir, {".one.yaml.tmp": policy_doc("one", "bot", '["mail.send"]')})
    os.replace(repo_dir / ".one.yaml.tmp", repo_dir / "one.yaml")
    assert results_until_current(watcher, repo_dir)[-1].ok
    assert tools_by_policy(db, ws_name) == {"one": ["mail.send"]}


def test_a_burst_of_saves_is_applied_together(repo_dir, db, ws_name):
    write_files(repo_dir, {"bot.yaml": agent_doc("bot")})

    def apply() -> ApplyResult:
        return apply_directory(db, repo_dir, workspace=ws_name)

    with Watcher(repo_dir, apply, debounce=1.0) as watcher:
        results_until_current(watcher, repo_dir)
        saves = 6
        for priority in range(saves):
            write_files(repo_dir, {"p.yaml": policy_doc("p", "bot", priority=priority)})
        applies = results_until_current(watcher, repo_dir)
    assert len(applies) < saves
    assert applies[-1].ok
    assert [p.fields["priority"] for p in live(db, ws_name).policies] == [saves - 1]


@pytest.mark.parametrize(
    ("path", "is_directory", "watched"),
    [
        ("agents/bot.yaml", False, True),
        ("bot.yml", False, True),
        ("agents", True, True),
        (".git/index", False, False),
        (".git/refs/x.yaml", False, False),
        (".git", True, False),
        ("agents/.bot.yaml.swp", False, False),
        ("agents/bot.yaml~", False, False),
        ("agents/#bot.yaml#", False, False),
        ("agents/bot.yaml.tmp", False, False),
        ("4913", False, False),
        ("README.md", False, False),
        ("../elsewhere.yaml", False, False),
        (".", True, False),
    ],
    ids=lambda value: str(value),
)
def test_only_policy_files_and_visible_folders_trigger_an_apply(path, is_directory, watched):
    assert is_watched_path(path, is_directory) is watched


def test_an_unreadable_folder_is_a_failed_result_not_an_exception(tmp_path, db, ws_name):
    result = apply_directory(db, tmp_path / "missing", workspace=ws_name)
    assert not result.ok
    assert "is not a directory" in (result.error or "")


# ------------------------------------------------------------------------ the watch verb


def stream_lines(stream: IO[str]) -> queue.Queue[str]:
    """Each line a child process writes, as it comes (EOF is an empty string)."""
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in stream:
            lines.put(line)
        lines.put("")

    threading.Thread(target=pump, daemon=True).start()
    return lines


def next_line_with(lines: queue.Queue[str], pattern: str) -> str:
    while True:
        line = lines.get(timeout=WAIT)
        if line == "":
            raise AssertionError(f"the process ended before printing {pattern!r}")
        if re.search(pattern, line):
            return line


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_the_watch_verb_logs_each_result_and_stops_cleanly_on_a_signal(
    signum, repo_dir, database_url, ws_name
):
    write_files(repo_dir, {"bot.yaml": agent_doc("bot"), "p.yaml": policy_doc("p", "bot")})
    command = [sys.executable, "-m", "controller", "watch", str(repo_dir), "--db", database_url,
               "--workspace", ws_name, "--debounce", "0.1"]  # fmt: skip
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    try:
        lines = stream_lines(process.stderr)
        first = next_line_with(lines, RESULT_LINE)
        assert re.search(r"Z sha256:[0-9a-f]{12} applied: 2 created, 0 updated, 0 deleted$", first)
        write_files(repo_dir, {"p.yaml": BROKEN_POLICY})
        assert "nothing was applied" in next_line_with(lines, RESULT_LINE + ".* failed: ")
        assert "p.yaml" in next_line_with(lines, "colour")
        process.send_signal(signum)
        assert process.wait(timeout=WAIT) == 0
        assert "stopped watching" in next_line_with(lines, "stopped")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_watch_needs_an_existing_folder(tmp_path, database_url):
    result = CliRunner().invoke(main, ["watch", str(tmp_path / "nope"), "--db", database_url])
    assert result.exit_code == 2
    assert "nope" in result.output  # click names the folder it refused, in its own words


# ---------------------------------------------------------------------------- serve --repo


def test_serve_watch_needs_a_repo(database_url):
    result = CliRunner().invoke(main, ["serve", "--watch", "--db", database_url])
    assert result.exit_code == 2
    assert "--watch needs --repo" in result.output


def _admin_key(database_url: str) -> str:
    arguments = [
        "keys",
        "create",
        "--name",
        "serve-repo",
        "--scopes",
        "admin",
        "--db",
        database_url,
    ]
    result = CliRunner().invoke(main, arguments, catch_exceptions=False)
    assert result.exit_code == 0
    return result.output.strip()


def _listed_agent_ids(base: str, headers: dict[str, str]) -> list[str]:
    """Every agent GET /v1/agents lists, page by page (other tests share the workspace)."""
    found: list[str] = []
    while True:
        params = {"limit": 200, "offset": len(found)}
        page = httpx.get(f"{base}/v1/agents", params=params, headers=headers).json()["data"]
        found += [agent["id"] for agent in page]
        if len(page) < 200:
            return found


def _eventually_found(url: str, headers: dict[str, str]) -> bool:
    """Whether ``url`` answers 200 within WAIT seconds: the watcher is a grandchild process
    with no other way to tell it applied (polled like tests/server.py polls /healthz)."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if httpx.get(url, headers=headers, timeout=5).status_code == 200:
            return True
        time.sleep(0.05)  # polling another process's effect, bounded by the deadline
    return False


@pytest.mark.slow
def test_serve_applies_the_repo_before_serving_and_watches_it(repo_dir, database_url, tmp_path):
    first, second = f"served-{secrets.token_hex(4)}", f"watched-{secrets.token_hex(4)}"
    write_files(repo_dir, {"first.yaml": agent_doc(first)})
    agent_id = load_repo(read_files(repo_dir)).agents[first].id
    port, log = free_port(), tmp_path / "serve.log"
    command = [sys.executable, "-m", "controller", "serve", "--port", str(port), "--db",
               database_url, "--workers", "1", "--repo", str(repo_dir), "--watch"]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )  # a session of its own: stop_server finds every process of it by PID
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_until_healthy(base, process, log)
        headers = {"Authorization": f"Bearer {_admin_key(database_url)}"}
        assert agent_id in _listed_agent_ids(base, headers)
        write_files(repo_dir, {"second.yaml": agent_doc(second)})
        second_id = load_repo(read_files(repo_dir)).agents[second].id
        assert _eventually_found(f"{base}/v1/agents/{second_id}", headers), log.read_text()
    finally:
        stop_server(process)
    text = log.read_text()
    assert "applied: 1 created" in text
    watcher_pid = int(re.findall(r"watching .* as pid (\d+)", text)[0])
    with pytest.raises(ProcessLookupError):
        os.kill(watcher_pid, 0)  # stopped with the server


@pytest.mark.slow
def test_serve_starts_with_a_broken_repo_and_reports_it(repo_dir, database_url, tmp_path):
    write_files(repo_dir, {"p.yaml": BROKEN_POLICY})
    port, log = free_port(), tmp_path / "serve.log"
    command = [sys.executable, "-m", "controller", "serve", "--port", str(port), "--db",
               database_url, "--workers", "1", "--repo", str(repo_dir)]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )  # a session of its own: stop_server finds every process of it by PID
    try:
        _wait_until_healthy(f"http://127.0.0.1:{port}", process, log)
    finally:
        stop_server(process)
    text = log.read_text()
    assert "failed: the repository has" in text
    assert "p.yaml" in text
    assert "the last applied policies stay in force" in text
