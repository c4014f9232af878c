"""``agentauth audit checkpoint`` and ``agentauth audit verify`` (decisions §7): take signed
checkpoints of a workspace's chain to keep away from the database host, and verify the chain,
against the database or offline against a JSONL export, with those checkpoints.

Exit codes of ``verify``: 0 when everything holds, 1 when something does not (the first failing
seq and what failed), 2 when it could not run (bad flags, unreadable files, no database).
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import click
import orjson

from core.config import DATABASE_URL_HELP, Settings
from core.domain import ids
from core.domain.auditchain import (
    ChainReport,
    Checkpoint,
    Finding,
    Run,
    Start,
    Stopped,
    VerifierKey,
    chain_runs,
    check_lines,
    origin_of,
    signed_checkpoints,
    split_notes,
    verify_chain,
)
from core.domain.errors import AgentAuthError
from core.store import chain, signing
from core.store.migrate import open_database
from core.store.models import Workspace

#: could not run at all (as click answers a usage error)
EXIT_ERROR = 2


def _stop(message: str) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(EXIT_ERROR)


@click.group()
def audit() -> None:
    """The verifiable audit log: signed checkpoints and verification."""


@audit.command()
@click.option("--db", help=DATABASE_URL_HELP)
@click.option("--workspace", default="default", show_default=True, help="the workspace's name")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="append the checkpoint to this file (default: print it)",
)
def checkpoint(db: str | None, workspace: str, out: Path | None) -> None:
    """Sign the chain's current head. Run it from cron and keep FILE off the database host."""
    try:
        settings = Settings.from_env(database_url=db)
        key = signing.load_or_create(settings, create=False)
        database = open_database(settings, write=False)
        try:
            with database.transaction() as session:
                workspace_id = _workspace(session, workspace)
                note = chain.checkpoint(session, workspace_id, key)
        finally:
            database.dispose()
    except AgentAuthError as exc:
        _stop(exc.message)
    if out is None:
        click.echo(note, nl=False)
        return
    try:
        with out.open("a", encoding="utf-8") as file:
            file.write(note)
            file.flush()
            os.fsync(file.fileno())
    except OSError as exc:
        _stop(f"cannot write {out}: {exc.strerror}")
    size = Checkpoint.parse(note.split("\n\n")[0] + "\n").size
    click.echo(f"appended the checkpoint of {workspace} at size {size} to {out}", err=True)


@audit.command()
@click.option("--db", help=DATABASE_URL_HELP + "; with --workspace")
@click.option(
    "--workspace",
    help="the workspace's name: with --db; with --export, whose checkpoints to hold it against",
)
@click.option(
    "--export",
    "exports",
    multiple=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="a JSONL export (GET /v1/audit-logs/export?format=jsonl) or prune archive (.jsonl.gz)"
    " to verify offline; repeatable, in seq order (the archives, then a later export)",
)
@click.option(
    "--checkpoint",
    "checkpoint_files",
    multiple=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="a file of signed checkpoints (repeatable)",
)
@click.option(
    "--public-key",
    type=click.Path(dir_okay=False, path_type=Path),
    help="the verifier key (GET /v1/audit-logs/public-key); with --db, the key file's by default",
)
@click.option(
    "--format", "output", type=click.Choice(["text", "json"]), default="text", show_default=True
)
def verify(
    db: str | None,
    workspace: str | None,
    exports: tuple[Path, ...],
    checkpoint_files: tuple[Path, ...],
    public_key: Path | None,
    output: str,
) -> None:
    """Recompute every entry's hash and the chain, and hold it against each checkpoint."""
    export = list(exports) or None
    if (export is None) == (db is None):
        raise click.UsageError("give either --db and --workspace, or --export FILE")
    if export is None and workspace is None:
        raise click.UsageError("--db needs --workspace NAME")
    notes = [note for path in checkpoint_files for note in split_notes(_read(path))]
    try:
        settings = Settings.from_env(database_url=db)
        if public_key is not None:
            key: VerifierKey | None = _verifier_key(public_key)
        elif notes and export is None:
            key = signing.verifier(settings, create=False)
        else:
            key = None
    except AgentAuthError as exc:
        _stop(exc.message)
    if notes and key is None:
        raise click.UsageError("checking checkpoints needs --public-key FILE")
    checkpoints, bad = signed_checkpoints(notes, key) if key is not None else ([], None)
    if export is not None:
        if workspace is not None:  # a file of several logs' checkpoints: this log's
            checkpoints = _of_log(checkpoints, origin_of(ids.workspace_id(workspace)))
        report = _verify_export(export, checkpoints) if bad is None else None
    else:
        assert workspace is not None
        report = _verify_database(settings, workspace, checkpoints) if bad is None else None
    if report is None:  # a checkpoint did not verify: nothing else is worth saying
        report = ChainReport(0, 0, 0, b"", 0, bad)
    _print(report, output, checkpointed=bool(notes))
    sys.exit(0 if report.ok else 1)


def _verify_database(
    settings: Settings, workspace: str, checkpoints: list[Checkpoint]
) -> ChainReport:
    try:
        database = open_database(settings, write=False)
        try:
            with database.transaction(snapshot=True) as session:
                workspace_id = _workspace(session, workspace)
                checkpoints = _of_log(checkpoints, origin_of(workspace_id))
                url = settings.database_url
                return chain.verify(session, workspace_id, checkpoints, url=url)
        finally:
            database.dispose()
    except AgentAuthError as exc:
        _stop(exc.message)


def _verify_export(paths: list[Path], checkpoints: list[Checkpoint]) -> ChainReport:
    """The exports, one after the other, checked a range of bytes at a time (by worker
    processes when they are long, each reading its own range; a gzip archive whole), the
    ranges stitched here; where something does not hold, read again from a few thousand lines
    before it to name what. An export that starts after seq 1 starts from the checkpoint of
    the size before it (the one of the archive before it)."""
    origins = {c.origin for c in checkpoints}
    if len(origins) > 1:
        _stop(
            "the checkpoints are of several logs: "
            + ", ".join(sorted(origins))
            + "; say which with --workspace NAME"
        )
    marks = frozenset(c.size for c in checkpoints)
    try:
        first = next(_all_lines(paths), {}).get("seq")
        start = Start()
        if isinstance(first, int) and first > 1:
            before = [c for c in checkpoints if c.size == first - 1]
            if not before:
                detail = (
                    f"the export starts at {first}: give the checkpoint of size {first - 1}"
                    " (the archive's before it) to verify it from there"
                )
                return ChainReport(0, 0, 0, b"", 0, Finding(first - 1, "missing", detail))
            start = Start(first - 1, before[0].head)
        size = sum(path.stat().st_size for path in paths)
        ranges = [item for path in paths for item in _byte_ranges(path, marks)]
        runs = chain.parallel(_check_bytes, ranges, size // _LINE_BYTES)
        found = chain_runs(runs, checkpoints, start)
        if isinstance(found, Stopped):
            rest = itertools.islice(_all_lines(paths), found.index, None)
            found = verify_chain(rest, checkpoints, start=found.start)
        return found
    except OSError as exc:
        _stop(f"cannot read {exc.filename}: {exc.strerror}")
    except (EOFError, gzip.BadGzipFile) as exc:  # an archive cut short, or not gzip at all
        return ChainReport(0, 0, 0, b"", 0, Finding(0, "malformed", f"not a whole archive: {exc}"))
    except _Malformed as exc:
        return ChainReport(0, 0, 0, b"", 0, Finding(0, "malformed", str(exc)))


#: about how long an exported line is, to tell a long log from a short one by its file's size
_LINE_BYTES = 400
_RANGE_BYTES = 4 << 20


def _byte_ranges(
    path: Path, marks: frozenset[int]
) -> Iterator[tuple[str, int, int, frozenset[int]]]:
    """The file in ranges of about _RANGE_BYTES, each ending at the end of a line (a gzip
    archive in one range: -1 to -1, read whole)."""
    if path.suffix == ".gz":
        yield str(path), -1, -1, marks
        return
    size = path.stat().st_size
    with path.open("rb") as file:
        start = 0
        while start < size:
            end = start + _RANGE_BYTES
            if end < size:
                file.seek(end)
                file.readline()
                end = file.tell()
            yield str(path), start, min(end, size), marks
            start = end


def _check_bytes(item: tuple[str, int, int, frozenset[int]]) -> Run:
    """In a worker: one range of the export's lines, read from the file, checked."""
    name, start, end, marks = item
    if start < 0:
        with gzip.open(name, "rb") as archive:
            return check_lines([line for line in archive if line.strip()], marks)
    with open(name, "rb") as file:
        file.seek(start)
        data = file.read(end - start)
    return check_lines([line for line in data.split(b"\n") if line.strip()], marks)


class _Malformed(Exception):
    pass


def _all_lines(paths: list[Path]) -> Iterator[dict[str, Any]]:
    for path in paths:
        opener: Any = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as file:
            yield from _lines(file)


def _lines(file: Any) -> Iterator[dict[str, Any]]:
    for number, line in enumerate(file, start=1):
        if not line.strip():
            continue
        try:
            entry = orjson.loads(line)
        except orjson.JSONDecodeError:
            raise _Malformed(f"line {number} is not JSON") from None
        if not isinstance(entry, dict):
            raise _Malformed(f"line {number} is not a JSON object")
        yield entry


def _of_log(checkpoints: list[Checkpoint], origin: str) -> list[Checkpoint]:
    """The checkpoints of the log ``origin`` (a file that ``agentauth serve`` keeps holds every
    workspace's); stops when checkpoints were given and none is of it."""
    mine = [found for found in checkpoints if found.origin == origin]
    if checkpoints and not mine:
        others = ", ".join(sorted({found.origin for found in checkpoints}))
        _stop(f"no checkpoint is of the log {origin}: they are of {others}")
    return mine


def _workspace(session: Any, name: str) -> str:
    workspace_id = ids.workspace_id(name)
    if session.get(Workspace, workspace_id) is None:
        _stop(f"no workspace named {name!r} in this database")
    return workspace_id


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        _stop(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}")


def _verifier_key(path: Path) -> VerifierKey:
    try:
        return VerifierKey.parse(_read(path))
    except ValueError as exc:
        _stop(f"{path}: {exc}")


def _print(report: ChainReport, output: str, *, checkpointed: bool) -> None:
    failure = report.failure
    if output == "json":
        body = {
            "ok": report.ok,
            "entries": report.entries,
            "erased": report.erased,
            "size": report.size,
            "head": report.head.hex(),
            "checkpoints": report.checkpoints,
            "start": report.start,
            "failure": None
            if failure is None
            else {"seq": failure.seq, "what": failure.what, "detail": failure.detail},
        }
        click.echo(json.dumps(body, indent=2))
        return
    if failure is not None:
        click.echo(f"FAILED at seq {failure.seq}: {failure.what}: {failure.detail}")
        return
    pruned = f", from entry {report.start + 1} (1 to {report.start} pruned)" if report.start else ""
    click.echo(
        f"ok: {report.entries} entries ({report.erased} erased){pruned}, head"
        f" {report.head.hex()}; {report.checkpoints} checkpoint(s) matched"
    )
    if not checkpointed:
        click.echo(
            "note: no checkpoint given; a log cut short or rebuilt wholesale verifies too"
            " unless a checkpoint taken earlier says otherwise"
        )


from api.retention import prune_command  # noqa: E402 - a verb of this group, in its own room

audit.add_command(prune_command)
