"""Reconcile: one attempt at making a workspace what a repository declares (read the files,
check them, plan, apply in one transaction, record the attempt), and its one-line report.

The one "load then apply" of the controller: the ``apply`` and ``watch`` verbs apply a
directory with :func:`apply_directory`, ``sync`` each new revision with :func:`apply_files`,
and ``serve --repo`` runs ``watch --once``. Called by ``controller.cli`` and
``controller.sync``; the transaction itself is ``controller.apply``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from controller.apply import ApplyResult, apply_repo
from controller.cache import DocumentCache
from controller.load import SourceFile
from controller.plan import Action
from controller.repo import DEFAULT_WORKSPACE, load_repo
from controller.sources import ReadLimits, read_files, revision_of
from core.domain.clock import Clock, utc_now
from core.domain.errors import AgentAuthError
from core.store.database import Database


def apply_files(
    db: Database,
    files: list[SourceFile],
    revision: str,
    source: str,
    *,
    workspace: str = DEFAULT_WORKSPACE,
    cache: DocumentCache | None = None,
    prune_agents: bool = False,
    adopt: bool = False,
    now: Clock = utc_now,
) -> ApplyResult:
    """Load ``files`` as a repository and apply it as one attempt. Database errors
    propagate."""
    repo = load_repo(files, workspace, cache)
    return apply_repo(
        db,
        repo,
        workspace=workspace,
        revision=revision,
        source=source,
        now=now(),
        prune_agents=prune_agents,
        adopt=adopt,
    )


def apply_directory(
    db: Database,
    directory: Path,
    *,
    workspace: str = DEFAULT_WORKSPACE,
    cache: DocumentCache | None = None,
    prune_agents: bool = False,
    adopt: bool = False,
    now: Clock = utc_now,
    limits: ReadLimits | None = None,
) -> ApplyResult:
    """Read (within ``limits``), validate and apply ``directory`` as one attempt. Never raises
    our errors: a folder that cannot be read or a database that cannot be written is a failed
    result (with revision ``unknown`` when the files could not be read)."""
    revision = "unknown"
    try:
        files = read_files(directory, limits)
        revision = revision_of(directory, files)
        source = str(directory.resolve())
        return apply_files(
            db,
            files,
            revision,
            source,
            workspace=workspace,
            cache=cache,
            prune_agents=prune_agents,
            adopt=adopt,
            now=now,
        )
    except AgentAuthError as exc:
        return ApplyResult(revision, None, exc.message)


def describe_result(result: ApplyResult, at: datetime | None = None) -> list[str]:
    """One line per result (time, revision, outcome), then one indented line per problem."""
    head = f"{timestamp(at)} {short_revision(result.revision)}"
    if not result.ok:
        return [f"{head} failed: {result.error}"] + [f"  {p}" for p in result.problems]
    assert result.plan is not None
    if not result.plan.has_changes:
        return [f"{head} unchanged"]
    counts = result.plan.summary()
    parts = [
        f"{counts[Action.CREATE]} created",
        f"{counts[Action.UPDATE]} updated",
        f"{counts[Action.DELETE]} deleted",
    ]
    if counts[Action.ORPHAN]:
        parts.append(f"{counts[Action.ORPHAN]} orphaned agent(s) kept")
    if counts["drift"]:
        parts.append(f"{counts['drift']} drifted object(s) repaired")
    return [f"{head} applied: " + ", ".join(parts)]


def timestamp(at: datetime | None = None) -> str:
    """A log line's time: UTC, to the second."""
    return f"{(at or utc_now()).astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"


def short_revision(revision: str) -> str:
    """A commit as its first 12 hex digits, a content hash as ``sha256:`` and 12."""
    commit, plus, rest = revision.partition("+")
    if commit.startswith("sha256:"):
        commit = commit[:19]
    elif len(commit) == 40 and all(c in "0123456789abcdef" for c in commit):
        commit = commit[:12]
    return commit + plus + rest
