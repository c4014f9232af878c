"""Sync: follow a branch of a remote git repository and apply each new commit to a workspace.

A bare repository in a work folder is fetched into (``git init --bare`` + fetch is a bare
clone that needs no remote configured, so no credentials are written to disk); a commit's
files are read straight from the object database (no checkout). Each new commit is applied
once: one that fails validation is recorded as failed by ``apply_repo`` and not tried again
until the branch moves. An unreachable remote, and an apply refused for conflicts or cut short
by the database, are retried with exponential backoff. Whatever fails, the last applied
revision stays in force.

Called by the ``sync`` verb: :meth:`GitSync.run` polls until told to stop; tests call
:meth:`GitSync.poll_once` after each push.
"""

from __future__ import annotations

import hashlib
import logging
import re
import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from pathlib import Path

import git

from controller.apply import ApplyResult
from controller.load import SourceFile
from controller.reconcile import describe_result, short_revision, timestamp
from controller.signals import wait_for_stop_signal
from controller.sources import ReadLimits, SourceError, read_revision
from core.domain.errors import AgentAuthError

logger = logging.getLogger(__name__)

DEFAULT_INTERVAL = 30.0
#: the longest wait after failures, as a multiple of the interval
MAX_BACKOFF = 10.0
#: a fetch that hangs (a black-holed network) is killed after this many seconds
FETCH_TIMEOUT = 300

#: (files, revision, source) -> the attempt's result
ApplyFiles = Callable[[list[SourceFile], str, str], ApplyResult]


class Outcome(StrEnum):
    APPLIED = "applied"  # a new commit, applied (possibly with nothing to change)
    REJECTED = "rejected"  # a new commit that failed validation: not retried
    UP_TO_DATE = "up-to-date"  # the branch has not moved since the last attempt
    UNREACHABLE = "unreachable"  # the fetch failed: retried with backoff
    ERROR = "error"  # the commit could not be read or applied (conflict, database): retried


@dataclass(frozen=True)
class PollResult:
    outcome: Outcome
    revision: str | None = None
    result: ApplyResult | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.outcome in (Outcome.APPLIED, Outcome.UP_TO_DATE)


class GitSync:
    """One remote branch followed into one workspace (through ``apply_fn``)."""

    def __init__(
        self,
        url: str,
        apply_fn: ApplyFiles,
        *,
        workdir: Path | None = None,
        branch: str = "main",
        path: str = "",
        interval: float = DEFAULT_INTERVAL,
        max_backoff: float = MAX_BACKOFF,
        limits: ReadLimits | None = None,
    ) -> None:
        self.url = url
        self.branch = branch
        self.path = path.strip("/")
        self.workdir = workdir  # None: a temporary folder, removed by close()
        self._temporary = workdir is None
        self.interval = interval
        self.max_backoff = max_backoff
        self.attempted: str | None = None  # the last commit handed to apply_fn with a result
        self.failures = 0  # consecutive polls that failed; reset by any success
        self._apply = apply_fn
        self._limits = limits
        self._repo: git.Repo | None = None

    @property
    def source(self) -> str:
        """What ``sync_status.source`` records: the URL without credentials, ``//`` and the
        folder when there is one (Terraform's notation for a folder of a repository)."""
        base = redact_url(self.url)
        return f"{base}//{self.path}" if self.path else base

    @property
    def next_delay(self) -> float:
        """Seconds until the next poll: the interval, doubled per consecutive failure up to
        ``max_backoff`` times the interval."""
        if self.failures == 0:
            return self.interval
        return min(self.interval * 2.0**self.failures, self.interval * self.max_backoff)

    def prepare(self) -> None:
        """Create (or reopen) the bare repository in ``workdir``. Raises SourceError."""
        if self._repo is not None:
            return
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="agentauth-sync-"))
        if _is_foreign_folder(self.workdir):
            raise SourceError(f"{self.workdir} is neither empty nor a bare git repository")
        try:
            self._repo = git.Repo.init(self.workdir, bare=True, mkdir=True)
        except (git.GitError, OSError) as exc:
            raise SourceError(f"cannot create a git repository in {self.workdir}: {exc}") from None

    def close(self) -> None:
        """End git's helper processes; remove the work folder if it was a temporary one."""
        if self._repo is not None:
            self._repo.close()
            self._repo = None
        if self._temporary and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def poll_once(self) -> PollResult:
        """Fetch; apply the branch's commit when it is not the last one attempted."""
        try:
            head = self._fetch()
        except SourceError as exc:
            return self._failed(PollResult(Outcome.UNREACHABLE, error=exc.message))
        if head == self.attempted:
            return self._succeeded(PollResult(Outcome.UP_TO_DATE, head))
        try:
            assert self._repo is not None
            files = read_revision(self._repo, head, self.path, limits=self._limits)
            result = self._apply(files, head, self.source)
        except AgentAuthError as exc:
            return self._failed(PollResult(Outcome.ERROR, head, error=exc.message))
        if not result.ok and not result.problems:
            # refused (a conflict an operator may resolve) or the database failed mid-apply:
            # recorded as failed, and tried again after a backoff
            return self._failed(PollResult(Outcome.ERROR, head, result, result.error))
        self.attempted = head
        outcome = Outcome.APPLIED if result.ok else Outcome.REJECTED
        return self._succeeded(PollResult(outcome, head, result))

    def run(
        self, stop: threading.Event, on_result: Callable[[PollResult], None] | None = None
    ) -> None:
        """Poll until ``stop`` is set, waiting :attr:`next_delay` between polls."""
        while not stop.is_set():
            try:
                polled = self.poll_once()
            except Exception:  # the loop outlives one bad poll; the traceback is logged
                logger.exception("syncing %s failed", self.source)
                polled = self._failed(PollResult(Outcome.ERROR, error="unexpected error"))
            if on_result is not None:
                on_result(polled)
            stop.wait(self.next_delay)

    def _fetch(self) -> str:
        """The commit the remote branch points at now."""
        self.prepare()
        assert self._repo is not None
        tracking = f"refs/remotes/origin/{self.branch}"
        try:
            with self._repo.git.custom_environment(GIT_TERMINAL_PROMPT="0"):
                self._repo.git.fetch(
                    "--no-tags",
                    self.url,
                    f"+refs/heads/{self.branch}:{tracking}",
                    kill_after_timeout=FETCH_TIMEOUT,
                )
            return self._repo.commit(tracking).hexsha
        except git.GitCommandError as exc:
            raise SourceError(self._fetch_error_message(exc)) from None
        except (git.GitError, ValueError) as exc:
            raise SourceError(f"cannot read {self.branch} of {self.source}: {exc}") from None

    def _fetch_error_message(self, exc: git.GitCommandError) -> str:
        """git's first ``fatal:`` line, without the credentials a URL may hold."""
        # GitPython wraps git's output as "\n  stderr: '...'"
        stderr = _GIT_STDERR.sub("", str(exc.stderr or "")).rstrip().removesuffix("'")
        lines = [line.strip() for line in stderr.splitlines() if line.strip()]
        fatal = [line for line in lines if line.startswith(("fatal: ", "error: "))]
        reason = (fatal or lines or [f"git exited with {exc.status}"])[0]
        reason = reason.removeprefix("fatal: ").removeprefix("error: ")
        reason = reason.replace(self.url, redact_url(self.url))
        return f"cannot fetch {self.branch} from {redact_url(self.url)}: {reason}"

    def _succeeded(self, polled: PollResult) -> PollResult:
        self.failures = 0
        return polled

    def _failed(self, polled: PollResult) -> PollResult:
        self.failures += 1
        return polled


def _is_foreign_folder(path: Path) -> bool:
    """A folder with files in it that is not a bare repository (a user's clone, say)."""
    if not path.exists():
        return False
    if not path.is_dir():
        return True
    return any(path.iterdir()) and not (path / "HEAD").is_file()


_GIT_STDERR = re.compile(r"^\s*stderr: '")
_USERINFO = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*://)[^/@]*@")


def redact_url(url: str) -> str:
    """The URL without a ``user:password@`` part (scp-like ``git@host:repo`` stays)."""
    return _USERINFO.sub(r"\1", url)


def default_workdir(cache_dir: str, url: str) -> Path | None:
    """Where the bare repository for ``url`` is kept between runs (None without a cache dir)."""
    if not cache_dir:
        return None
    key = hashlib.sha256(url.encode()).hexdigest()[:24]
    return Path(cache_dir) / "git" / key


def describe_poll(polled: PollResult, next_delay: float, at: datetime | None = None) -> list[str]:
    """The log lines for one poll: nothing when the branch has not moved."""
    if polled.outcome is Outcome.UP_TO_DATE:
        return []
    retry = f"; next try in {next_delay:g}s"
    if polled.result is not None:
        lines = describe_result(polled.result, at)
        return [lines[0] + retry, *lines[1:]] if polled.outcome is Outcome.ERROR else lines
    revision = short_revision(polled.revision) if polled.revision else "-"
    return [f"{timestamp(at)} {revision} {polled.outcome}: {polled.error}{retry}"]


def follow_until_signalled(follower: GitSync, on_result: Callable[[PollResult], None]) -> None:
    """Poll in a worker thread while the main thread waits for SIGINT or SIGTERM; a poll in
    progress finishes before this returns. Closes ``follower``."""
    stop = threading.Event()
    worker = threading.Thread(
        target=follower.run, args=(stop, on_result), name="agentauth-sync", daemon=True
    )
    worker.start()
    try:
        wait_for_stop_signal()
    finally:
        stop.set()
        worker.join()
        follower.close()
