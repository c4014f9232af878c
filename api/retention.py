"""One prune of one workspace's audit log (decisions §9), as ``agentauth audit prune`` and the
retention of ``agentauth serve`` run it: the steps of ``core.store.retention`` in order, with
the prune's own audit entry (``action`` ``audit.prune``) chained after the archive verified
and before the entries go, so the log that continues records it.

A run first completes a removal that a stopped run left; a stop at any point loses no entry
(an entry is removed only once a verified archive holds it) and the next run completes the
work (written again, the same archive has the same name; recorded once, a pruned head only
moves forward).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import NoReturn, TypeVar

import click
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import select

from core.config import ARCHIVE_FORMATS, DATABASE_URL_HELP, Settings
from core.domain import ids
from core.domain.auditchain import ChainReport, Checkpoint, parse_note
from core.domain.clock import Clock, parse_instant, utc_now
from core.domain.errors import AgentAuthError
from core.hotpath.recorder import Recorder
from core.store import audit, retention, signing
from core.store.database import Database
from core.store.migrate import open_database
from core.store.models import AuditEntry, Workspace

#: the agent id an audit entry of the service itself names (a prune): the nil UUID
SERVICE = "00000000-0000-0000-0000-000000000000"
T = TypeVar("T")


@dataclass(frozen=True)
class Pruned:
    """What a prune did: the range it took (None: nothing was before the cut), where its
    archive and checkpoint are, the archive's verification, and how many entries went."""

    taken: retention.Plan | None
    archive: Path | None = None
    checkpoint: Path | None = None
    report: ChainReport | None = None
    removed: int = 0
    #: entries a stopped prune had archived and recorded, removed first
    resumed: int = 0
    #: the archive's Parquet form, when asked for (written once the archive verified)
    parquet: Path | None = None

    @property
    def ok(self) -> bool:
        return self.report is None or self.report.ok


#: how much lower than decisions a prune's archive runs (nice): writing and verifying millions of
#: entries takes every core it is given, which the server's workers need more
PRUNE_NICE = 10


def yield_the_cpu() -> None:
    """Run the calling thread (on Linux; elsewhere the process) at :data:`PRUNE_NICE` below
    what it ran at, and the processes it starts from now on (verifying an archive's workers)
    too. A nice value once raised cannot be lowered without privileges: call it only on a
    thread, or in a process, that does nothing else afterwards."""
    with contextlib.suppress(OSError):  # not permitted here: the prune runs as it is
        os.nice(PRUNE_NICE)


def _below(work: Callable[[], T]) -> T:
    """``work``'s result, run on a thread of its own lowered by :func:`yield_the_cpu`: the
    archive's writing and verifying, which hold no lock anyone waits for. The removal, which
    holds SQLite's write lock a batch at a time, stays at the decisions' own priority: held by
    a thread the scheduler puts off, that lock would keep every decision waiting."""
    with ThreadPoolExecutor(1, "agentauth-prune-archive", initializer=yield_the_cpu) as pool:
        return pool.submit(work).result()


def prune(
    db: Database,
    key: Ed25519PrivateKey,
    workspace_id: str,
    name: str,
    before: datetime,
    folder: Path,
    clock: Clock,
    *,
    dry_run: bool = False,
    archive_format: str = "jsonl",
    below: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Pruned:
    """Archive, verify, record and remove the entries before ``before``; with ``dry_run``,
    only say what that would take. With ``archive_format`` ``parquet``, the verified archive's
    Parquet form is written beside it before anything is recorded or removed. With ``below``,
    the archive is written and verified below the decisions' priority (:func:`_below`).
    ``progress`` is told when the removal starts (a day of a busy log takes minutes)."""
    resumed = 0 if dry_run else retention.remove(db, workspace_id)  # what a stop left
    with db.transaction() as session:
        taken = retention.plan(session, workspace_id, before)
    if taken is None:
        return Pruned(None, resumed=resumed)
    archive, note = retention.archive_paths(folder, name, taken)
    if dry_run:
        return Pruned(taken, archive, note)

    def archived() -> tuple[Path, Path, Checkpoint, ChainReport, Path | None]:
        archive, note = retention.write_archive(db, taken, folder, name, key)
        checkpoint = Checkpoint.parse(parse_note(note.read_text(encoding="utf-8")).text)
        report = retention.verify_archive(archive, checkpoint, taken)
        if not report.ok:
            return archive, note, checkpoint, report, None
        table = retention.write_parquet(archive) if archive_format == "parquet" else None
        return archive, note, checkpoint, report, table

    archive, note, checkpoint, report, table = _below(archived) if below else archived()
    if not report.ok:
        return Pruned(taken, archive, note, report, resumed=resumed)
    if not _audited(db, workspace_id, taken):  # a stopped run's entry says it already
        _audit_the_prune(db, workspace_id, taken, archive, clock)
    with db.transaction(write=True) as session:
        retention.record(session, taken, checkpoint.head)
    if progress is not None:
        progress(f"verified the archive of entries {taken.first} to {taken.last}; removing them")
    removed = retention.remove(db, workspace_id)
    return Pruned(taken, archive, note, report, removed, resumed, table)


def prune_every_workspace(
    db: Database,
    key: Ed25519PrivateKey,
    days: int,
    folder: Path,
    clock: Clock,
    archive_format: str = "jsonl",
) -> list[tuple[str, Pruned]]:
    """The retention of ``agentauth serve``: each workspace's entries older than ``days``
    archived into ``folder`` (in ``archive_format`` too) and pruned; what came of each
    workspace that had any."""
    with db.transaction() as session:
        workspaces = session.execute(select(Workspace.id, Workspace.name)).all()
    cut = clock() - timedelta(days=days)
    done = []
    for workspace_id, name in workspaces:
        pruned = prune(
            db, key, workspace_id, name, cut, folder, clock, archive_format=archive_format
        )
        if pruned.taken is not None or pruned.resumed:
            done.append((name, pruned))
    return done


def _audited(db: Database, workspace_id: str, taken: retention.Plan) -> bool:
    """Whether the workspace's newest prune entry is of ``taken``'s range (a run stopped
    after writing it, before recording the pruned head)."""
    with db.transaction() as session:
        newest = session.scalar(
            select(AuditEntry.parameters)
            .where(AuditEntry.workspace_id == workspace_id, AuditEntry.tool_name == retention.PRUNE)
            .order_by(AuditEntry.timestamp.desc(), AuditEntry.id.desc())
            .limit(1)
        )
    return isinstance(newest, dict) and (newest.get("first"), newest.get("last")) == (
        taken.first,
        taken.last,
    )


def _audit_the_prune(
    db: Database, workspace_id: str, taken: retention.Plan, archive: Path, clock: Clock
) -> None:
    now = clock()
    row = audit.entry(
        workspace_id=workspace_id,
        agent_id=SERVICE,
        agent_exists=False,
        key_id=None,
        tool_name=retention.PRUNE,
        parameters={"first": taken.first, "last": taken.last, "archive": archive.name},
        result="allowed",
        policy_id=None,
        rule_index=None,
        reason=f"pruned entries {taken.first} to {taken.last}, archived in {archive.name}",
        latency_ms=0.0,
        timestamp=now,
        action=retention.PRUNE,
    )
    recorder = Recorder.for_database(db)
    try:
        recorder.run(lambda batch: batch.append_audit(row))
    finally:
        recorder.close()


@click.command("prune")
@click.option("--db", help=DATABASE_URL_HELP)
@click.option("--workspace", required=True, help="the workspace's name")
@click.option(
    "--before",
    required=True,
    help="ISO 8601 instant: the entries up to the newest one before it are archived and pruned",
)
@click.option(
    "--archive",
    "folder",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="the folder the archive and its checkpoint are written to",
)
@click.option(
    "--archive-format",
    type=click.Choice(ARCHIVE_FORMATS),
    default="jsonl",
    show_default=True,
    help="parquet: also write the verified archive as <WORKSPACE>-<first>-<last>.parquet",
)
@click.option("--dry-run", is_flag=True, help="say what would be archived and removed, do nothing")
def prune_command(
    db: str | None, workspace: str, before: str, folder: Path, archive_format: str, dry_run: bool
) -> None:
    """Archive the oldest entries, verify the archive, then remove them from the database.

    Writes <WORKSPACE>-<first>-<last>.jsonl.gz (the JSONL export's lines) and its signed
    .checkpoint to --archive, and with --archive-format parquet the same entries as .parquet
    beside them; exits 1, removing nothing, when the archive does not verify."""
    try:
        cut = parse_instant(before)
    except ValueError:
        raise click.BadParameter("must be an ISO 8601 date-time", param_hint="--before") from None
    try:
        settings = Settings.from_env(database_url=db)
        key = signing.load_or_create(settings, create=False)
        database = open_database(settings, write=not dry_run)
    except AgentAuthError as exc:
        _stop(exc.message)
    try:
        with database.transaction() as session:
            workspace_id = ids.workspace_id(workspace)
            if session.get(Workspace, workspace_id) is None:
                _stop(f"no workspace named {workspace!r} in this database")
        done = prune(
            database, key, workspace_id, workspace, cut, folder, utc_now,
            dry_run=dry_run, archive_format=archive_format, below=True, progress=click.echo,
        )  # fmt: skip
    except (AgentAuthError, retention.ArchiveError, OSError) as exc:
        _stop(getattr(exc, "message", None) or str(exc))
    finally:
        database.dispose()
    _say(done, before, dry_run)
    sys.exit(0 if done.ok else 1)


def _say(done: Pruned, before: str, dry_run: bool) -> None:
    if done.resumed:
        click.echo(f"removed {done.resumed} entries a stopped prune had archived")
    taken = done.taken
    if taken is None:
        click.echo(f"nothing to prune: no entry before {before} that is not pruned already")
        return
    what = f"entries {taken.first} to {taken.last} ({taken.count})"
    if dry_run:
        click.echo(f"would archive {what} to {done.archive} and remove them (dry run)")
        return
    if done.report is not None and not done.report.ok:
        failure = done.report.failure
        assert failure is not None
        click.echo(
            f"FAILED: the archive {done.archive} does not verify at seq {failure.seq}:"
            f" {failure.what}: {failure.detail}; nothing was removed"
        )
        return
    click.echo(f"archived {what} to {done.archive}, checkpoint {done.checkpoint}; verified")
    if done.parquet is not None:
        click.echo(f"wrote the archive's Parquet form to {done.parquet}")
    click.echo(f"removed {done.removed} entries: pruned 1 to {taken.last}")


def _stop(message: str) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(2)
