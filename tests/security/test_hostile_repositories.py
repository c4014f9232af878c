"""Hostile policy repositories: what a repository can make the controller read.

A repository is input, written by whoever can open a pull request. It may hold symbolic links
out of itself (to a secret, to ``/dev/zero``), FIFOs, sockets, devices, huge files, submodules
and links in git that point anywhere. Only regular files inside the repository root are read,
each and all together within a size limit; everything else is refused by path, the same way for
a directory and for a git revision, and nothing is applied. Real directories, links and FIFOs in
``tmp_path``; real git repositories made there with the git CLI.
"""

from __future__ import annotations

import os
import resource
import socket
import stat
import subprocess
import textwrap
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import git
import pytest
from click.testing import CliRunner, Result

from controller.cli import main
from controller.reconcile import apply_files
from controller.sources import (
    BROKEN,
    HIDDEN,
    LEAVES,
    SUBMODULE,
    ReadLimits,
    SourceError,
    read_files,
    read_revision,
)
from controller.sync import GitSync, Outcome
from core.config import Settings
from core.store.migrate import open_database

SECRET = "TOPSECRET_FIELD"
SECRET_DOC = f"""\
apiVersion: agentauth/v1
kind: Agent
metadata:
  name: stolen
spec:
  {SECRET}: hunter2
"""
AGENT = """\
apiVersion: agentauth/v1
kind: Agent
metadata:
  name: bot
spec: {description: answers mail}
"""
POLICY = """\
apiVersion: agentauth/v1
kind: Policy
metadata:
  name: mail
spec:
  agent: bot
  rules:
    - type: tool_allowlist
      tools: ["mail.read"]
"""
TOO_LARGE = "the limit for one policy file (AGENTAUTH_MAX_POLICY_FILE_BYTES); not read"


def write(root: Path, files: dict[str, str]) -> None:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A file outside the repository that a link must not reveal."""
    path = tmp_path / "outside" / "secret.yaml"
    write(path.parent, {path.name: SECRET_DOC})
    return path


@pytest.fixture
def repo_dir(tmp_path: Path) -> Path:
    """A valid repository (one agent, one policy) to make hostile."""
    path = tmp_path / "repo"
    write(path, {"agents/bot.yaml": AGENT, "policies/mail.yaml": POLICY})
    return path


@pytest.fixture
def run(tmp_path: Path) -> Callable[..., Result]:
    """``agentauth ARGS`` as a user runs it, with extra ``AGENTAUTH_*`` variables."""

    def invoke(*args: Any, **env: str) -> Result:
        environment = {"AGENTAUTH_CACHE_DIR": str(tmp_path / "cache"), "NO_COLOR": "1", **env}
        return CliRunner().invoke(
            main, [str(a) for a in args], env=environment, catch_exceptions=False
        )

    return invoke


def refusals(files: list[Any]) -> dict[str, str]:
    return {f.path: f.refused for f in files if f.refused is not None}


# ----------------------------------------------------------------------- directory source


def test_a_link_leaving_the_repository_is_refused_by_path_not_read(
    repo_dir: Path, secret: Path, run: Callable[..., Result]
) -> None:
    (repo_dir / "leak.yaml").symlink_to(secret)
    (repo_dir / "policies" / "up.yaml").symlink_to(Path("..") / ".." / "outside" / secret.name)

    result = run("validate", repo_dir)

    assert result.exit_code == 1
    assert f"leak.yaml:1:1: $: {LEAVES}" in result.output
    assert f"policies/up.yaml:1:1: $: {LEAVES}" in result.output
    assert SECRET not in result.output
    assert str(secret) not in result.output  # nor where it leads


@contextmanager
def memory_capped(extra: int = 1 << 30) -> Iterator[None]:
    """At most ``extra`` more bytes of address space meanwhile (Linux): a reader that
    follows the link to /dev/zero fails with MemoryError instead of filling the machine."""
    try:
        status = Path("/proc/self/status").read_text(encoding="ascii")
        used = int(status.split("VmSize:")[1].split()[0]) * 1024
    except (OSError, IndexError, ValueError):
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = used + extra if hard == resource.RLIM_INFINITY else min(used + extra, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def test_a_link_to_dev_zero_is_refused_without_reading_it(
    repo_dir: Path, run: Callable[..., Result]
) -> None:
    (repo_dir / "zero.yaml").symlink_to("/dev/zero")

    with memory_capped():
        result = run("validate", repo_dir)

    assert result.exit_code == 1
    assert f"zero.yaml:1:1: $: {LEAVES}" in result.output


def test_a_fifo_is_never_opened(repo_dir: Path, run: Callable[..., Result]) -> None:
    """A writer waits on the FIFO: had the reader opened it, it would have read the secret
    (with no writer, it would have waited forever)."""
    fifo = repo_dir / "x.yaml"
    os.mkfifo(fifo)
    writer = threading.Thread(target=fifo.write_text, args=(SECRET_DOC,), daemon=True)
    writer.start()
    try:
        result = run("validate", repo_dir)
    finally:  # release the writer: hold the other end open while it writes and leaves
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        writer.join()
        os.close(reader)

    assert result.exit_code == 1
    assert "x.yaml:1:1: $: is not a regular file (a FIFO); not read" in result.output
    assert SECRET not in result.output


def test_sockets_devices_and_folders_named_like_policy_files_are_refused(
    repo_dir: Path,
) -> None:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(repo_dir / "socket.yaml"))
    (repo_dir / "folder.yml").symlink_to(repo_dir / "agents", target_is_directory=True)
    device = repo_dir / "null.yaml"
    try:
        os.mknod(device, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # /dev/null's numbers
    except PermissionError:
        device.symlink_to("/dev/null")  # not root: a link out, refused before it is looked at
    try:
        refused = refusals(read_files(repo_dir))
    finally:
        sock.close()

    assert refused["socket.yaml"] == "is not a regular file (a socket); not read"
    assert refused["folder.yml"] == "is not a regular file (a folder); not read"
    assert refused["null.yaml"] in ("is not a regular file (a character device); not read", LEAVES)


def test_a_link_that_stays_inside_is_followed(repo_dir: Path, run: Callable[..., Result]) -> None:
    write(repo_dir, {"shared/helper.txt": AGENT.replace("name: bot", "name: helper")})
    (repo_dir / "agents" / "helper.yaml").symlink_to(Path("..") / "shared" / "helper.txt")

    files = read_files(repo_dir)

    assert refusals(files) == {}
    assert b"name: helper" in next(f for f in files if f.path == "agents/helper.yaml").content
    assert run("validate", repo_dir).exit_code == 0


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        pytest.param(".git/config", HIDDEN, id="into-dot-git"),
        pytest.param("missing.yaml", BROKEN, id="dangling"),
        pytest.param("loop.yaml", BROKEN, id="loop"),
    ],
)
def test_links_into_hidden_folders_dangling_or_looping_are_refused(
    repo_dir: Path, target: str, reason: str
) -> None:
    write(repo_dir, {".git/config": "[remote]\n  url: https://token@example.com\n"})
    (repo_dir / "loop.yaml").symlink_to("loop2.yaml")
    (repo_dir / "loop2.yaml").symlink_to("loop.yaml")
    (repo_dir / "link.yaml").symlink_to(target)

    assert refusals(read_files(repo_dir))["link.yaml"] == reason


def test_a_file_over_the_default_limit_is_refused(
    repo_dir: Path, run: Callable[..., Result]
) -> None:
    (repo_dir / "huge.yaml").write_bytes(b"# " + b"x" * (1024 * 1024) + b"\n")

    result = run("validate", repo_dir)

    assert result.exit_code == 1
    assert f"huge.yaml:1:1: $: is larger than 1 MiB, {TOO_LARGE}" in result.output


def test_the_file_limit_is_configurable(repo_dir: Path, run: Callable[..., Result]) -> None:
    size = len(POLICY.encode())
    at_limit = run("validate", repo_dir, AGENTAUTH_MAX_POLICY_FILE_BYTES=str(size))
    below = run("validate", repo_dir, AGENTAUTH_MAX_POLICY_FILE_BYTES=str(size - 1))

    assert at_limit.exit_code == 0, at_limit.output
    assert below.exit_code == 1
    assert f"policies/mail.yaml:1:1: $: is larger than {size - 1:,} bytes, {TOO_LARGE}" in (
        below.output
    )


def test_a_repository_over_its_limit_is_not_read(
    repo_dir: Path, run: Callable[..., Result]
) -> None:
    result = run("validate", repo_dir, AGENTAUTH_MAX_POLICY_REPO_BYTES="200")

    assert result.exit_code == 1
    assert result.output == (
        f"error: the policy files of {repo_dir} hold more than 200 bytes, the limit for one "
        "repository (AGENTAUTH_MAX_POLICY_REPO_BYTES); nothing was read\n"
    )


@pytest.mark.parametrize("value", ["0", "-1", "lots"])
def test_limits_must_be_positive_whole_numbers(
    repo_dir: Path, run: Callable[..., Result], value: str
) -> None:
    result = run("validate", repo_dir, AGENTAUTH_MAX_POLICY_FILE_BYTES=value)

    assert result.exit_code == 1
    assert "error: AGENTAUTH_MAX_POLICY_FILE_BYTES must be" in result.output


def test_an_unreadable_folder_is_an_error_not_an_empty_one(
    repo_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Skipping it would read as "its policies were deleted" and prune them. The folder is
    made unreadable by the listing failing as the kernel fails it for a user without the
    permission (permission bits would not stop root, who runs CI)."""
    locked = repo_dir / "policies"
    listing = os.scandir

    def scandir(path: Any = ".") -> Any:
        if Path(path) == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return listing(path)

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(SourceError, match=r"cannot read .*policies: Permission denied"):
        read_files(repo_dir)


@pytest.mark.parametrize("verb", ["apply", "watch"])
def test_apply_and_watch_apply_nothing_from_a_hostile_repository(
    repo_dir: Path,
    secret: Path,
    run: Callable[..., Result],
    database_url: str,
    verb: str,
) -> None:
    (repo_dir / "leak.yaml").symlink_to(secret)
    workspace = f"hostile-{verb}"
    once = ["--once"] if verb == "watch" else []

    result = run(verb, repo_dir, "--workspace", workspace, "--db", database_url, *once)

    assert result.exit_code == 1
    assert f"leak.yaml:1:1: $: {LEAVES}" in result.output
    assert SECRET not in result.output
    plan = run("plan", repo_dir.parent / "empty", "--workspace", workspace, "--db", database_url)
    assert "bot" not in plan.output  # nothing of the repository was applied


# ----------------------------------------------------------------------------- git source


class Git:
    """A work tree committed with the git CLI (symbolic links, submodule entries and all)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.repo = git.Repo.init(root)

    def git(self, *args: str) -> str:
        return subprocess.run(
            ["git", "-c", "user.name=A", "-c", "user.email=a@example.com", *args],
            cwd=self.root,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()

    def commit(
        self, files: dict[str, str] | None = None, links: dict[str, str] | None = None
    ) -> str:
        write(self.root, files or {})
        for name, target in (links or {}).items():
            path = self.root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.symlink_to(target)
        self.git("add", "-A")
        self.git("commit", "-q", "--allow-empty", "-m", "change")
        return self.git("rev-parse", "HEAD")


@pytest.fixture
def work(tmp_path: Path) -> Git:
    repo = Git(tmp_path / "work")
    repo.commit({"policies/agents/bot.yaml": AGENT, "policies/mail.yaml": POLICY})
    return repo


#: the two sources of one commit's policy folder: its git tree, and its checkout on the disk
SOURCES = [
    pytest.param(lambda work: read_revision(work.repo, "HEAD", "policies"), id="git"),
    pytest.param(lambda work: read_files(work.root / "policies"), id="directory"),
]


@pytest.mark.parametrize("read", SOURCES)
def test_links_are_resolved_and_refused_when_they_leave_the_same_in_git_and_on_disk(
    work: Git, secret: Path, read: Callable[[Git], list[Any]]
) -> None:
    """In git, a link is a blob holding its target, resolved in the commit's tree."""
    work.commit(
        files={
            "policies/shared/helper.txt": AGENT.replace("name: bot", "name: helper"),
            "policies/.github/x.yaml": SECRET_DOC,
            "README.yaml": "# above the policy folder\n",
        },
        links={
            "policies/absolute.yaml": str(secret),
            "policies/up.yaml": "../../outside/secret.yaml",
            "policies/out-of-root.yaml": "../README.yaml",  # in the tree, above --path
            "policies/hidden.yaml": ".github/x.yaml",
            "policies/dangling.yaml": "nothing.yaml",
            "policies/folder.yaml": "shared",
            "policies/agents/helper.yaml": "../shared/helper.txt",
            "policies/via-folder-link.yaml": "linked/helper.txt",
            "policies/linked": "shared",
        },
    )

    files = read(work)

    assert refusals(files) == {
        "absolute.yaml": LEAVES,
        "up.yaml": LEAVES,
        "out-of-root.yaml": LEAVES,
        "hidden.yaml": HIDDEN,
        "dangling.yaml": BROKEN,
        "folder.yaml": "is not a regular file (a folder); not read",
    }
    followed = {f.path: f.content for f in files if f.refused is None}
    assert b"name: helper" in followed["agents/helper.yaml"]
    assert b"name: helper" in followed["via-folder-link.yaml"]
    assert all(SECRET.encode() not in content for content in followed.values())


@pytest.mark.parametrize("read", SOURCES)
def test_link_loops_are_refused(work: Git, read: Callable[[Git], list[Any]]) -> None:
    work.commit(links={"policies/a.yaml": "b.yaml", "policies/b.yaml": "a.yaml"})

    assert refusals(read(work)) == {
        "a.yaml": BROKEN,
        "b.yaml": BROKEN,
    }


def test_a_git_submodule_named_like_a_policy_file_is_refused(work: Git) -> None:
    head = work.git("rev-parse", "HEAD")
    work.git("update-index", "--add", "--cacheinfo", f"160000,{head},policies/sub.yaml")
    work.git("commit", "-q", "-m", "a submodule entry")

    assert refusals(read_revision(work.repo, "HEAD", "policies")) == {"sub.yaml": SUBMODULE}


def test_git_size_limits(work: Git) -> None:
    work.commit({"policies/huge.yaml": "# " + "x" * 2000 + "\n"})
    limits = ReadLimits(file_bytes=1000, repo_bytes=10_000)

    assert refusals(read_revision(work.repo, "HEAD", "policies", limits=limits)) == {
        "huge.yaml": f"is larger than 1,000 bytes, {TOO_LARGE}"
    }
    with pytest.raises(SourceError, match=r"of 'policies' at revision 'HEAD' hold more than"):
        read_revision(work.repo, "HEAD", "policies", limits=ReadLimits(repo_bytes=300))


def test_a_git_path_that_is_a_link_is_not_a_folder(work: Git) -> None:
    work.commit(links={"elsewhere": "policies"})

    with pytest.raises(SourceError, match="'elsewhere' is not a folder at revision 'HEAD'"):
        read_revision(work.repo, "HEAD", "elsewhere")


def test_diff_refuses_a_leaking_link(work: Git, secret: Path, run: Callable[..., Result]) -> None:
    work.commit(links={"policies/leak.yaml": str(secret)})

    result = run("diff", "HEAD~1", "HEAD", "--repo", work.root, "--path", "policies")

    assert result.exit_code == 1
    assert f"leak.yaml:1:1: $: {LEAVES}" in result.output


@pytest.fixture
def db(database_url: str, tmp_path: Path) -> Iterator[Any]:
    database = open_database(Settings(database_url=database_url), write=True)
    yield database
    database.dispose()


def test_sync_rejects_a_commit_with_a_leaking_link_and_applies_nothing(
    work: Git, secret: Path, db: Any, tmp_path: Path
) -> None:
    remote = tmp_path / "remote.git"
    git.Repo.init(remote, bare=True)
    work.commit(links={"policies/leak.yaml": str(secret)})
    work.git("push", "-q", str(remote), "HEAD:refs/heads/main")
    follower = GitSync(
        str(remote),
        partial(apply_files, db, workspace="hostile-sync"),
        workdir=tmp_path / "sync",
        path="policies",
    )
    try:
        polled = follower.poll_once()
    finally:
        follower.close()

    assert polled.outcome is Outcome.REJECTED
    assert polled.result is not None
    assert polled.result.plan is None
    assert [str(p) for p in polled.result.problems] == [f"leak.yaml:1:1: $: {LEAVES}"]


def test_the_example_repository_reads_the_same(tmp_path: Path) -> None:
    """The rules change nothing for an ordinary repository."""
    example = Path(__file__).parents[2] / "policies_repo_example"
    files = read_files(example)
    assert refusals(files) == {}
    assert all(f.content == (example / f.path).read_bytes() for f in files)


def _dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")
