"""sync against throwaway git remotes made in tmp_path (a bare repository pushed to from a work
clone; no network), applied to the real database of this run. Tests push, then call
``poll_once`` themselves: no timers, no sleeps."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import git
import pytest

from api import create_app
from controller.apply import ApplyResult
from controller.reconcile import apply_files
from controller.sources import SourceError
from controller.sync import (
    GitSync,
    Outcome,
    PollResult,
    default_workdir,
    describe_poll,
    redact_url,
)
from core.config import Settings
from core.domain import ids
from core.store import agents as agent_store
from core.store.database import Database
from tests.conftest import FakeClock, Tenant
from tests.controller.conftest import agent_doc, write_files
from tests.controller.test_watch import (
    BROKEN_POLICY,
    RESULT_LINE,
    WAIT,
    live,
    next_line_with,
    policy_doc,
    stream_lines,
    sync_status,
)

INTERVAL = 30.0
FILES = {
    "policies/bot.yaml": agent_doc("bot", "description: answers mail"),
    "policies/mail.yaml": policy_doc("mail", "bot", '["mail.read"]'),
    "README.md": "not a policy file, and outside the policy folder anyway\n",
}


class Remote:
    """A bare repository standing in for the git server, and a clone that pushes to it."""

    def __init__(self, root: Path) -> None:
        self.url = str(root / "remote.git")
        git.Repo.init(self.url, bare=True)
        self.work = git.Repo.init(root / "work")
        self.author = git.Actor("Policy Author", "author@example.com")

    def push(self, files: dict[str, str | None], branch: str = "main") -> str:
        """Commit ``files`` (None deletes one) and push; the new commit's sha."""
        write_files(Path(str(self.work.working_tree_dir)), files)
        self.work.git.add("-A")
        commit = self.work.index.commit("change", author=self.author, committer=self.author)
        self.work.git.push(self.url, f"HEAD:refs/heads/{branch}")
        return commit.hexsha


@pytest.fixture
def remote(tmp_path: Path) -> Remote:
    return Remote(tmp_path)


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(Settings(database_url=database_url))
    yield database
    database.dispose()


def follower_for(url: str, db: Database, workspace: str, workdir: Path) -> GitSync:
    apply_fn = partial(apply_files, db, workspace=workspace)
    return GitSync(url, apply_fn, workdir=workdir, path="policies", interval=INTERVAL)


@pytest.fixture
def follower(remote: Remote, db: Database, ws_name: str, tmp_path: Path) -> Iterator[GitSync]:
    follower = follower_for(remote.url, db, ws_name, tmp_path / "clone")
    yield follower
    follower.close()


def mail_tools(db: Database, workspace: str) -> list[str]:
    (policy,) = live(db, workspace).policies
    tools: list[str] = policy.fields["rules"][0]["tools"]
    return tools


def test_each_new_commit_is_applied_and_a_broken_one_keeps_the_last(remote, follower, db, ws_name):
    a = remote.push(FILES)
    polled = follower.poll_once()
    assert (polled.outcome, polled.revision) == (Outcome.APPLIED, a)
    status = sync_status(db, ws_name)
    assert (status.applied_revision, status.source) == (a, remote.url + "//policies")
    assert mail_tools(db, ws_name) == ["mail.read"]
    assert follower.poll_once().outcome is Outcome.UP_TO_DATE

    b = remote.push({"policies/mail.yaml": policy_doc("mail", "bot", '["mail.send"]')})
    polled = follower.poll_once()
    assert (polled.outcome, polled.revision) == (Outcome.APPLIED, b)
    assert mail_tools(db, ws_name) == ["mail.send"]

    c = remote.push({"policies/mail.yaml": BROKEN_POLICY})
    polled = follower.poll_once()
    assert (polled.outcome, polled.revision) == (Outcome.REJECTED, c)
    assert polled.result is not None
    assert any(p.file == "mail.yaml" for p in polled.result.problems)
    status = sync_status(db, ws_name)
    assert (status.result, status.attempted_revision, status.applied_revision) == (
        "failed",
        c,
        b,
    )
    assert mail_tools(db, ws_name) == ["mail.send"]
    # the broken commit is not tried again; the remote answered, so no backoff
    assert follower.poll_once().outcome is Outcome.UP_TO_DATE
    assert sync_status(db, ws_name).attempted_at == status.attempted_at
    assert follower.next_delay == INTERVAL


def test_the_clone_is_bare_and_reused(remote, db, ws_name, tmp_path):
    a = remote.push(FILES)
    first = follower_for(remote.url, db, ws_name, tmp_path / "clone")
    assert first.poll_once().outcome is Outcome.APPLIED
    first.close()
    assert git.Repo(tmp_path / "clone").bare
    again = follower_for(remote.url, db, ws_name, tmp_path / "clone")
    polled = again.poll_once()  # a new process applies the head once more: nothing to change
    again.close()
    assert (polled.outcome, polled.revision) == (Outcome.APPLIED, a)
    assert polled.result is not None
    assert polled.result.plan is not None
    assert not polled.result.plan.has_changes


def _decide(database_url: str, workspace: str, tool: str) -> bool:
    """Whether the served API allows the repository's agent ``bot`` to call ``tool``."""
    app = create_app(Settings(database_url=database_url, rate_limit_per_minute=100_000))
    try:
        tenant = Tenant(app, workspace, FakeClock())
        (agent,) = live(app.extensions["agentauth"].db, workspace).agents
        body = {"agent_id": agent.id, "tool_name": tool, "parameters": {}}
        response = app.test_client().post(
            "/v1/authorize", json=body, headers=tenant.headers("admin")
        )
        assert response.status_code == 200, response.get_data(as_text=True)
        return bool(response.json["allowed"])
    finally:
        app.extensions["agentauth"].close()


def test_an_unreachable_remote_backs_off_and_changes_nothing(
    remote, follower, db, ws_name, database_url
):
    a = remote.push(FILES)
    follower.poll_once()
    hidden = Path(remote.url).with_name("moved-away.git")
    Path(remote.url).rename(hidden)
    delays = []
    for _ in range(5):
        polled = follower.poll_once()
        assert polled.outcome is Outcome.UNREACHABLE
        assert polled.error is not None
        assert polled.error.startswith(f"cannot fetch main from {remote.url}: ")
        delays.append(follower.next_delay)
    assert delays == [2 * INTERVAL, 4 * INTERVAL, 8 * INTERVAL, 10 * INTERVAL, 10 * INTERVAL]
    status = sync_status(db, ws_name)
    assert (status.attempted_revision, status.applied_revision) == (a, a)
    assert mail_tools(db, ws_name) == ["mail.read"]
    # the last applied revision is what decisions are still made from
    assert _decide(database_url, ws_name, "mail.read") is True
    assert _decide(database_url, ws_name, "mail.send") is False

    hidden.rename(remote.url)
    b = remote.push({"policies/mail.yaml": policy_doc("mail", "bot", '["mail.send"]')})
    assert follower.poll_once().revision == b
    assert follower.next_delay == INTERVAL
    assert mail_tools(db, ws_name) == ["mail.send"]


def test_a_remote_that_never_existed_is_a_failed_poll(db, ws_name, tmp_path):
    follower = follower_for(str(tmp_path / "nowhere.git"), db, ws_name, tmp_path / "clone")
    polled = follower.poll_once()
    follower.close()
    assert not polled.ok
    assert polled.outcome is Outcome.UNREACHABLE
    # ours, then git's reason in git's words
    url = str(tmp_path / "nowhere.git")
    assert re.match(rf"cannot fetch main from {re.escape(url)}: \S", polled.error or "")
    assert follower.next_delay == 2 * INTERVAL
    assert live(db, ws_name).agents == ()


def test_a_missing_branch_is_a_failed_poll(remote, db, ws_name, tmp_path):
    remote.push(FILES, branch="release")
    follower = follower_for(remote.url, db, ws_name, tmp_path / "clone")
    polled = follower.poll_once()
    follower.close()
    assert polled.outcome is Outcome.UNREACHABLE
    assert re.match(rf"cannot fetch main from {re.escape(remote.url)}: \S", polled.error or "")


def test_an_agent_suspended_in_the_database_stays_suspended_after_a_sync(
    remote, follower, db, ws_name
):
    remote.push(FILES)
    follower.poll_once()
    (agent,) = live(db, ws_name).agents
    workspace_id = ids.workspace_id(ws_name)
    with db.transaction(write=True) as session:
        body = {"status": "suspended"}
        agent_store.update_agent(session, workspace_id, agent.id, body, datetime.now(UTC))
    remote.push({"policies/bot.yaml": agent_doc("bot", "description: answers all mail")})
    assert follower.poll_once().outcome is Outcome.APPLIED
    (agent,) = live(db, ws_name).agents
    assert agent.fields["description"] == "answers all mail"
    assert agent.fields["status"] == "suspended"


def test_a_database_failure_is_retried_with_backoff(remote, db, ws_name, tmp_path):
    a = remote.push(FILES)
    failing = True

    def apply_fn(files, revision, source) -> ApplyResult:
        if failing:
            raise SourceError("the database is down")  # any of our errors, raised by the apply
        return apply_files(db, files, revision, source, workspace=ws_name)

    follower = GitSync(
        remote.url, apply_fn, workdir=tmp_path / "clone", path="policies", interval=INTERVAL
    )
    assert follower.poll_once().outcome is Outcome.ERROR
    assert follower.next_delay == 2 * INTERVAL
    failing = False
    polled = follower.poll_once()  # the same commit, tried again
    follower.close()
    assert (polled.outcome, polled.revision) == (Outcome.APPLIED, a)
    assert follower.next_delay == INTERVAL


def test_a_folder_that_is_not_a_bare_clone_is_refused(remote, db, ws_name, tmp_path):
    working_tree = Path(str(remote.work.working_tree_dir))
    follower = follower_for(remote.url, db, ws_name, working_tree)
    with pytest.raises(SourceError, match="neither empty nor a bare git repository"):
        follower.prepare()


def test_without_a_workdir_a_temporary_clone_is_removed_on_close(remote, db, ws_name):
    remote.push(FILES)
    follower = GitSync(remote.url, partial(apply_files, db, workspace=ws_name), path="policies")
    assert follower.poll_once().outcome is Outcome.APPLIED
    workdir = follower.workdir
    assert workdir is not None
    assert workdir.is_dir()
    follower.close()
    assert not workdir.exists()


def never_applied(files, revision, source) -> ApplyResult:
    raise AssertionError("nothing is applied here")


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://user:token@git.example.com/p.git", "https://git.example.com/p.git"),
        ("https://token@git.example.com/p.git", "https://git.example.com/p.git"),
        ("ssh://git@git.example.com/p.git", "ssh://git.example.com/p.git"),
        ("git@git.example.com:team/p.git", "git@git.example.com:team/p.git"),
        ("/srv/git/p.git", "/srv/git/p.git"),
    ],
    ids=["user-and-token", "token", "ssh-user", "scp-like", "path"],
)
def test_credentials_never_reach_the_status_or_the_log(url, shown):
    assert redact_url(url) == shown
    follower = GitSync(url, never_applied, path="/policies/")
    assert follower.source == shown + "//policies"


def test_default_workdir_is_per_url_under_the_cache_dir(tmp_path):
    one = default_workdir(str(tmp_path), "https://example.com/a.git")
    assert one is not None
    assert one.parent == tmp_path / "git"
    assert one != default_workdir(str(tmp_path), "https://example.com/b.git")
    assert default_workdir("", "https://example.com/a.git") is None


def test_log_lines_say_what_happened_and_when_the_next_try_is():
    at = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
    sha = "0123456789abcdef0123456789abcdef01234567"
    unreachable = PollResult(Outcome.UNREACHABLE, error="cannot fetch main from x: gone")
    assert describe_poll(unreachable, 60, at) == [
        "2026-11-21T12:00:00Z - unreachable: cannot fetch main from x: gone; next try in 60s"
    ]
    assert describe_poll(PollResult(Outcome.UP_TO_DATE, sha), 30, at) == []
    refused = ApplyResult(sha, None, "1 conflict(s), nothing was applied: ...")
    assert describe_poll(PollResult(Outcome.ERROR, sha, refused, refused.error), 60, at) == [
        "2026-11-21T12:00:00Z 0123456789ab failed: 1 conflict(s), nothing was applied: ...;"
        " next try in 60s"
    ]


# --------------------------------------------------------------------------- the sync verb


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_the_sync_verb_applies_the_branch_and_stops_cleanly_on_a_signal(
    signum, remote, database_url, ws_name, tmp_path
):
    a = remote.push(FILES)
    command = [sys.executable, "-m", "controller", "sync", "--git", remote.url, "--path",
               "policies", "--workspace", ws_name, "--db", database_url, "--workdir",
               str(tmp_path / "clone")]  # fmt: skip
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    try:
        lines = stream_lines(process.stderr)
        next_line_with(lines, f"^following main of {re.escape(remote.url)}//policies ")
        applied = next_line_with(lines, RESULT_LINE)
        assert re.search(rf"Z {a[:12]} applied: 2 created, 0 updated, 0 deleted$", applied)
        process.send_signal(signum)
        assert process.wait(timeout=WAIT) == 0
        next_line_with(lines, "^stopped syncing")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
