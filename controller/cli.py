"""The ``agentauth`` command: one click group, one function per verb.

Settings are built here, once, from flags and ``AGENTAUTH_*`` variables, and passed down. Over
300 lines on purpose: every controller verb lives here, each only reading its flags and calling
the pipeline, so one verb's change touches one function.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from importlib.metadata import EntryPoint, distributions
from pathlib import Path
from typing import NoReturn

import click

from controller.apply import ApplyResult
from controller.cache import DocumentCache, paused_gc
from controller.evidence import Evidence, gather, mode_changes
from controller.impact import DEFAULT_REPLAY, AgentImpact, analyse
from controller.load import SourceFile
from controller.plan import Action, Plan, build_plan
from controller.reconcile import apply_directory, apply_files, describe_result
from controller.render import render_json, render_markdown, render_text
from controller.repo import DEFAULT_WORKSPACE, Repo, load_repo
from controller.signals import wait_for_stop_signal
from controller.sources import ReadLimits, open_repository, read_files, read_revision
from controller.state import as_applied, read_live
from core.config import DATABASE_URL_HELP, Settings
from core.domain.errors import AgentAuthError
from core.store.migrate import open_database
from schemas import Problem


def _fail(error: AgentAuthError) -> None:
    click.echo(f"error: {error.message}", err=True)
    sys.exit(1)


class _Verbs(click.Group):
    """The controller's verbs, and those that other packages offer through the
    ``agentauth.commands`` entry points (the service's ``serve``, ``keys`` and ``db``, in
    ``api.cli``): the command line is one, the packages stay apart."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *_offered()})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        found = super().get_command(ctx, cmd_name)
        offered = _offered().get(cmd_name)
        if found is None and offered is not None:
            command: click.Command = offered.load()
            return command
        return found


def _offered() -> dict[str, EntryPoint]:
    """Every copy of agentauth's metadata on the path counts (a stale ``*.egg-info`` left in a
    checkout would otherwise hide the installed one's verbs)."""
    return {
        entry.name: entry
        for found in distributions(name="agentauth")
        for entry in found.entry_points.select(group="agentauth.commands")
    }


@click.group(cls=_Verbs)
@click.version_option(package_name="agentauth")
def main() -> None:
    """agentauth: authorization for AI agents' tool calls, run as policy-as-code."""


# ------------------------------------------------------------------- policy repository verbs

FORMATS = click.Choice(["text", "json", "markdown"])
WORKSPACE_HELP = "workspace the repository is applied to (created on first use)"
PLAN_PRUNE_HELP = "plan the deletion of managed agents gone from the repository"


def _cache(settings: Settings, directory: Path) -> DocumentCache:
    if not settings.cache_dir:
        return DocumentCache(None)
    key = hashlib.sha256(str(directory.resolve()).encode()).hexdigest()[:24]
    return DocumentCache(Path(settings.cache_dir) / "documents" / f"{key}.marshal")


def _read_repo(
    directory: Path, workspace: str, settings: Settings
) -> tuple[Repo, list[SourceFile]]:
    files = read_files(directory, ReadLimits.from_settings(settings))
    return load_repo(files, workspace, _cache(settings, directory)), files


def _print_problems(problems: Sequence[Problem]) -> None:
    for problem in problems:
        click.echo(f"{problem}" + (" (warning)" if problem.severity != "error" else ""))


def _refuse_invalid(repo: Repo) -> None:
    """Print every problem and exit 1 when the repository has errors."""
    if repo.errors:
        _print_problems(repo.problems)
        click.echo(f"error: {len(repo.errors)} problem(s) in the repository", err=True)
        sys.exit(1)


def _style() -> Callable[..., str]:
    colored = sys.stdout.isatty() and "NO_COLOR" not in os.environ
    return click.style if colored else (lambda text, **_: text)


@main.command()
@click.argument("directory", type=click.Path(path_type=Path))
def validate(directory: Path) -> None:
    """Check a policy repository: every schema and semantic problem, with file:line:col."""
    try:
        repo, files = _read_repo(directory, DEFAULT_WORKSPACE, Settings.from_env())
    except AgentAuthError as exc:
        _fail(exc)
    _print_problems(repo.problems)
    errors, warnings = len(repo.errors), len(repo.warnings)
    summary = f"{len(files)} file(s): {errors} error(s), {warnings} warning(s)"
    click.echo(summary, err=True)
    sys.exit(1 if errors else 0)


@main.command()
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--workspace", default=DEFAULT_WORKSPACE, show_default=True, help=WORKSPACE_HELP)
@click.option("--db", help=DATABASE_URL_HELP)
@click.option("--format", "fmt", type=FORMATS, default="text", show_default=True)
@click.option("--detailed-exitcode", is_flag=True, help="exit 2 when there are changes")
@click.option("--prune-agents", is_flag=True, help=PLAN_PRUNE_HELP)
@click.option("--adopt", is_flag=True, help="plan taking over unmanaged objects with the same id")
@click.option(
    "--replay",
    default=DEFAULT_REPLAY,
    show_default=True,
    type=click.IntRange(0, 1_000_000),
    help="recent calls per changed agent to replay (0: no impact analysis)",
)
def plan(
    directory: Path,
    workspace: str,
    db: str | None,
    fmt: str,
    detailed_exitcode: bool,
    prune_agents: bool,
    adopt: bool,
    replay: int,
) -> None:
    """Show what apply (with the same flags) would change in the database, field by field, and
    its impact. Exit 1 when apply would refuse it (a conflict)."""
    try:
        settings = Settings.from_env(database_url=db)
        repo, _ = _read_repo(directory, workspace, settings)
        _refuse_invalid(repo)
        database = open_database(settings, write=False)
        with paused_gc(), database.transaction(snapshot=True) as session:
            live = read_live(session, repo.workspace_id, repo)
            the_plan = build_plan(repo, live, prune_agents=prune_agents, adopt=adopt)
            impacts = analyse(session, repo, the_plan, replay)
            evidence = gather(session, repo.workspace_id, the_plan, datetime.now(UTC))
        database.dispose()
    except AgentAuthError as exc:
        _fail(exc)
    _render(the_plan, impacts, repo.warnings, fmt, "agentauth plan", evidence)
    _exit_for(the_plan, detailed_exitcode)


def _exit_for(the_plan: Plan, detailed_exitcode: bool) -> NoReturn:
    """After a plan is shown: 1 when apply would refuse it (a conflict), else 2 when it has
    changes and --detailed-exitcode was given, else 0."""
    conflicts = the_plan.of(Action.CONFLICT)
    if conflicts:
        click.echo(f"error: {len(conflicts)} conflict(s); apply would refuse this plan", err=True)
        sys.exit(1)
    sys.exit(2 if detailed_exitcode and the_plan.has_changes else 0)


def _render(
    the_plan: Plan,
    impacts: Sequence[AgentImpact],
    warnings: Sequence[Problem],
    fmt: str,
    title: str,
    evidence: Sequence[Evidence] = (),
) -> None:
    if fmt == "json":
        click.echo(render_json(the_plan, list(impacts), warnings, evidence), nl=False)
    elif fmt == "markdown":
        click.echo(render_markdown(the_plan, impacts, warnings, title, evidence), nl=False)
    else:
        click.echo(render_text(the_plan, impacts, warnings, _style(), evidence), nl=False)


@main.command()
@click.argument("base")
@click.argument("head")
@click.option(
    "--repo",
    "repo_path",
    default=".",
    show_default=True,
    type=click.Path(path_type=Path),
    help="the git repository",
)
@click.option("--path", "subdir", default="", help="the policy folder inside the git repository")
@click.option("--workspace", default=DEFAULT_WORKSPACE, show_default=True, help=WORKSPACE_HELP)
@click.option("--format", "fmt", type=FORMATS, default="text", show_default=True)
@click.option("--detailed-exitcode", is_flag=True, help="exit 2 when there are changes")
@click.option("--prune-agents", is_flag=True, help=PLAN_PRUNE_HELP)
@click.option(
    "--db",
    help="a database to read the shadow reports of the policies whose mode changes from "
    "(read only; without it, diff reads no database)",
)
def diff(
    base: str,
    head: str,
    repo_path: Path,
    subdir: str,
    workspace: str,
    fmt: str,
    detailed_exitcode: bool,
    prune_agents: bool,
    db: str | None,
) -> None:
    """What changes from git revision BASE to HEAD of a policy repository: the plan of HEAD
    against a database where BASE was applied, with the same flags. No database is read, unless
    ``--db`` is given for the evidence of mode changes (decisions §10)."""
    try:
        settings = Settings.from_env(database_url=db) if db else Settings.from_env()
        limits = ReadLimits.from_settings(settings)
        git_repo = open_repository(repo_path)
        before_files = read_revision(git_repo, base, subdir, missing_ok=True, limits=limits)
        before = load_repo(before_files, workspace)
        after = load_repo(read_revision(git_repo, head, subdir, limits=limits), workspace)
    except AgentAuthError as exc:
        _fail(exc)
    _refuse_invalid(after)
    the_plan = build_plan(after, as_applied(before), prune_agents=prune_agents)
    evidence = mode_changes(the_plan)
    if db and evidence:
        try:
            database = open_database(settings, write=False)
            with database.transaction(snapshot=True) as session:
                evidence = gather(session, after.workspace_id, the_plan, datetime.now(UTC))
            database.dispose()
        except AgentAuthError as exc:
            _fail(exc)
    _render(the_plan, [], after.warnings, fmt, f"agentauth diff {base}..{head}", evidence)
    _exit_for(the_plan, detailed_exitcode)


@main.command()
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--workspace", default=DEFAULT_WORKSPACE, show_default=True, help=WORKSPACE_HELP)
@click.option("--db", help=DATABASE_URL_HELP)
@click.option(
    "--prune-agents", is_flag=True, help="also delete managed agents gone from the repository"
)
@click.option("--adopt", is_flag=True, help="take over unmanaged objects that have the same id")
def apply(directory: Path, workspace: str, db: str | None, prune_agents: bool, adopt: bool) -> None:
    """Make the database what the repository declares, in one transaction."""
    try:
        settings = Settings.from_env(database_url=db)
        database = open_database(settings, write=True)
    except AgentAuthError as exc:
        _fail(exc)
    result = apply_directory(
        database,
        directory,
        workspace=workspace,
        cache=_cache(settings, directory),
        prune_agents=prune_agents,
        adopt=adopt,
        limits=ReadLimits.from_settings(settings),
    )
    database.dispose()
    _report_apply(result)


def _report_apply(result: ApplyResult) -> None:
    if not result.ok:
        _print_problems(result.problems)
        click.echo(f"error: {result.error}", err=True)
        click.echo(f"revision {result.revision} was not applied", err=True)
        sys.exit(1)
    assert result.plan is not None
    click.echo(render_text(result.plan, style=_style()), nl=False)
    verb = "applied" if result.plan.has_changes else "already applied, nothing to change"
    click.echo(f"revision {result.revision}: {verb}")


@main.command()
@click.argument("directory", type=click.Path(path_type=Path))
@click.option(
    "--workspace",
    default=DEFAULT_WORKSPACE,
    show_default=True,
    help="workspace the ids are derived for (they order policies of equal priority)",
)
@click.option(
    "--junit",
    type=click.Path(dir_okay=False, path_type=Path),
    help="also write a JUnit XML report to this file",
)
@click.option("-v", "--verbose", is_flag=True, help="also print passing cases and warnings")
def test(directory: Path, workspace: str, junit: Path | None, verbose: bool) -> None:
    """Run the repository's PolicyTest documents through the engine, offline (no database)."""
    from controller.tests import case_line, junit_xml, run_tests, summary

    try:
        repo, _ = _read_repo(directory, workspace, Settings.from_env())
    except AgentAuthError as exc:
        _fail(exc)
    _refuse_invalid(repo)
    if verbose:
        _print_problems(repo.warnings)
    report = run_tests(repo)
    for document in report.documents:
        for case in document.cases:
            if verbose or not case.passed:
                click.echo(case_line(document, case))
    if junit is not None:
        try:
            junit.write_bytes(junit_xml(report))
        except OSError as exc:
            click.echo(f"error: cannot write {junit}: {exc.strerror or exc}", err=True)
            sys.exit(1)
    click.echo(summary(report))
    if not report.documents:
        click.echo(f"warning: no PolicyTest documents in {directory}", err=True)
    sys.exit(0 if report.ok else 1)


# ------------------------------------------------------------------------- watch and sync


def _log_lines(lines: Sequence[str]) -> None:
    for line in lines:
        click.echo(line, err=True)


@main.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--workspace", default=DEFAULT_WORKSPACE, show_default=True, help=WORKSPACE_HELP)
@click.option("--db", help=DATABASE_URL_HELP)
@click.option(
    "--debounce",
    default=0.5,
    show_default=True,
    type=click.FloatRange(0, 60),
    help="seconds without a further change before applying",
)
@click.option(
    "--prune-agents", is_flag=True, help="also delete managed agents gone from the repository"
)
@click.option(
    "--once", is_flag=True, help="apply once, report it in one line and exit (1 if it failed)"
)
def watch(
    directory: Path, workspace: str, db: str | None, debounce: float, prune_agents: bool, once: bool
) -> None:
    """Apply DIRECTORY now and again after every saved change, until stopped (Ctrl-C)."""
    from controller.watch import Watcher

    try:
        settings = Settings.from_env(database_url=db)
        database = open_database(settings, write=True)
    except AgentAuthError as exc:
        _fail(exc)
    cache = _cache(settings, directory)

    def attempt() -> ApplyResult:
        return apply_directory(
            database,
            directory,
            workspace=workspace,
            cache=cache,
            prune_agents=prune_agents,
            limits=ReadLimits.from_settings(settings),
        )

    if once:
        result = attempt()
        database.dispose()
        for line in describe_result(result):
            click.echo(line, err=not result.ok)
        sys.exit(0 if result.ok else 1)
    watcher = Watcher(
        directory, attempt, debounce, on_result=lambda result: _log_lines(describe_result(result))
    )
    watcher.start()
    click.echo(f"watching {directory} as pid {os.getpid()} (Ctrl-C to stop)", err=True)
    try:
        wait_for_stop_signal()
    finally:
        watcher.stop()
        database.dispose()
    click.echo("stopped watching", err=True)


@main.command()
@click.option("--git", "url", required=True, help="the repository to follow (any URL git fetches)")
@click.option("--branch", default="main", show_default=True)
@click.option("--path", "subdir", default="", help="the policy folder inside the repository")
@click.option(
    "--interval",
    default=30.0,
    show_default=True,
    type=click.FloatRange(min=1),
    help="seconds between fetches (doubled per failure, up to 10 times)",
)
@click.option("--workspace", default=DEFAULT_WORKSPACE, show_default=True, help=WORKSPACE_HELP)
@click.option("--db", help=DATABASE_URL_HELP)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    help="where the bare clone is kept (default: under the cache directory)",
)
@click.option(
    "--prune-agents", is_flag=True, help="also delete managed agents gone from the repository"
)
def sync(
    url: str,
    branch: str,
    subdir: str,
    interval: float,
    workspace: str,
    db: str | None,
    workdir: Path | None,
    prune_agents: bool,
) -> None:
    """Follow a branch of a git repository: apply each new commit, until stopped (Ctrl-C)."""
    from functools import partial

    from controller.sync import (
        GitSync,
        default_workdir,
        describe_poll,
        follow_until_signalled,
    )

    try:
        settings = Settings.from_env(database_url=db)
        database = open_database(settings, write=True)
        folder = workdir or default_workdir(settings.cache_dir, url)
        cache = _cache(settings, folder) if folder is not None else DocumentCache(None)
        follower = GitSync(
            url,
            partial(
                apply_files, database, workspace=workspace, cache=cache, prune_agents=prune_agents
            ),
            workdir=folder,
            branch=branch,
            path=subdir,
            interval=interval,
            limits=ReadLimits.from_settings(settings),
        )
        follower.prepare()
    except AgentAuthError as exc:
        _fail(exc)
    click.echo(f"following {branch} of {follower.source} (Ctrl-C to stop)", err=True)
    follow_until_signalled(
        follower, lambda polled: _log_lines(describe_poll(polled, follower.next_delay))
    )
    database.dispose()
    click.echo("stopped syncing", err=True)
