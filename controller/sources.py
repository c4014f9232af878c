"""Where a repository's files come from: a directory on disk, or a revision of a git
repository read straight from its object database (no checkout). Both give the same
``SourceFile`` list, so validate, plan, apply and diff do not care which.

Also the revision that identifies what is applied: the commit when the directory is a clean
part of a git work tree, else a hash of the files' contents. GitPython errors become
:class:`SourceError` here, where they enter.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from controller.load import SourceFile, is_document_path, read_directory
from core.domain.errors import AgentAuthError

if TYPE_CHECKING:  # GitPython is imported by the functions that use it: plan and validate
    import git  # of a plain directory never do, and it takes a tenth of a second


class SourceError(AgentAuthError):
    """A repository or revision that cannot be read."""

    code = "SOURCE_ERROR"


def read_files(directory: Path) -> list[SourceFile]:
    if not directory.is_dir():
        raise SourceError(f"{directory} is not a directory")
    try:
        return read_directory(directory)
    except OSError as exc:
        raise SourceError(f"cannot read {directory}: {exc.strerror or exc}") from None


def content_hash(files: Sequence[SourceFile]) -> str:
    digest = hashlib.sha256()
    for source in sorted(files, key=lambda f: f.path):
        digest.update(f"{source.path}\0{source.digest}\n".encode())
    return "sha256:" + digest.hexdigest()


def revision_of(directory: Path, files: Sequence[SourceFile]) -> str:
    """The git commit when ``directory`` is inside a work tree and has no uncommitted change
    under it; with uncommitted changes, the commit plus a content hash; outside git, the hash."""
    import git

    contents = content_hash(files)
    try:
        repo = git.Repo(directory, search_parent_directories=True)
        if repo.bare or repo.working_tree_dir is None or not repo.head.is_valid():
            return contents
        commit = repo.head.commit.hexsha
        inside = directory.resolve().relative_to(Path(repo.working_tree_dir).resolve())
        scope = inside.as_posix() if str(inside) != "." else None
        dirty = repo.is_dirty(untracked_files=True, path=scope)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError, ValueError):
        return contents
    except git.GitError as exc:
        raise SourceError(f"cannot read git state of {directory}: {exc}") from None
    return f"{commit}+dirty.{contents[7:19]}" if dirty else commit


def open_repository(path: Path) -> git.Repo:
    import git

    try:
        return git.Repo(path, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise SourceError(f"{path} is not inside a git repository") from None


def read_revision(
    repo: git.Repo, revision: str, subdir: str = "", *, missing_ok: bool = False
) -> list[SourceFile]:
    """The policy files under ``subdir`` at ``revision`` (any rev-parse expression), read from
    the object database. Paths are relative to ``subdir``. A ``subdir`` missing at that
    revision is an error (applying "nothing" would prune every managed policy), unless
    ``missing_ok`` (the base of a diff that adds the folder)."""
    import git

    try:
        commit = repo.commit(revision)
    except (git.BadName, git.BadObject, ValueError, git.GitCommandError):
        raise SourceError(f"unknown revision '{revision}'") from None
    tree = commit.tree
    prefix = PurePosixPath(subdir.strip("/")) if subdir.strip("/") else None
    if prefix is not None:
        try:
            tree = tree / prefix.as_posix()
        except KeyError:
            if missing_ok:
                return []
            raise SourceError(f"'{prefix}' does not exist at revision '{revision}'") from None
    files = []
    for item in tree.traverse():
        if not isinstance(item, git.Blob):
            continue
        relative = (
            PurePosixPath(item.path).relative_to(prefix) if prefix else PurePosixPath(item.path)
        )
        if is_document_path(relative.as_posix()):
            files.append(SourceFile(relative.as_posix(), item.data_stream.read()))
    return sorted(files, key=lambda f: f.path)
