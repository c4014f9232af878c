"""Where a repository's files come from: a directory on disk, or a revision of a git
repository read straight from its object database (no checkout). Both give the same
``SourceFile`` list, so validate, plan, apply, test, watch, sync and diff do not care which.

The one place a repository's files are found and read, so the one place that bounds what a
repository can make the controller read (the repository is input, possibly hostile):

- only regular files are read: a FIFO, a device, a socket or a folder named ``*.yaml`` is
  refused, never opened (a git submodule likewise);
- a symbolic link is followed only while it stays inside the repository root, outside hidden
  folders such as ``.git``; one that leaves (or dangles, or loops) is refused, naming its path
  and nothing of its target. In git, a link is a blob holding its target: it is resolved in the
  commit's tree, never on the disk. Links to folders are never entered;
- a file larger than :attr:`ReadLimits.file_bytes` is refused, and a repository whose policy
  files hold more than :attr:`ReadLimits.repo_bytes` in all is not read at all.

A refused file becomes one problem of that file (``SourceFile.refused``), so ``validate``
reports it with every other problem and nothing is applied; a repository over its size limit is
a :class:`SourceError`.

Also the revision that identifies what is applied: the commit when the directory is a clean
part of a git work tree, else a hash of the files' contents. GitPython errors become
:class:`SourceError` here, where they enter.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from controller.load import SourceFile, is_document_path
from core.config import DEFAULT_MAX_POLICY_FILE_BYTES, DEFAULT_MAX_POLICY_REPO_BYTES, Settings
from core.domain.errors import AgentAuthError

if TYPE_CHECKING:  # GitPython is imported by the functions that use it: plan and validate
    import git  # of a plain directory never do, and it takes a tenth of a second

#: links followed to reach one file before it counts as a loop (Linux's own bound)
MAX_LINKS = 40
#: the longest link target read from a git blob (a longer one is no path: PATH_MAX)
_MAX_LINK_BYTES = 4096

LEAVES = "is a symbolic link leading outside the repository; not read"
HIDDEN = "is a symbolic link into a hidden folder; not read"
BROKEN = "is a symbolic link to nothing, or a loop of links; not read"
SUBMODULE = "is a git submodule, not a file; not read"


class SourceError(AgentAuthError):
    """A repository or revision that cannot be read."""

    code = "SOURCE_ERROR"


@dataclass(frozen=True)
class ReadLimits:
    """How much a repository may make the controller read: of one policy file, and of all its
    policy files together (``AGENTAUTH_MAX_POLICY_FILE_BYTES``, ``..._REPO_BYTES``)."""

    file_bytes: int = DEFAULT_MAX_POLICY_FILE_BYTES
    repo_bytes: int = DEFAULT_MAX_POLICY_REPO_BYTES

    @classmethod
    def from_settings(cls, settings: Settings) -> ReadLimits:
        return cls(settings.max_policy_file_bytes, settings.max_policy_repo_bytes)

    def too_large(self) -> str:
        return (
            f"is larger than {_amount(self.file_bytes)}, the limit for one policy file "
            "(AGENTAUTH_MAX_POLICY_FILE_BYTES); not read"
        )


class _Budget:
    """The bytes read so far from one repository, against its limit."""

    def __init__(self, limits: ReadLimits, where: str) -> None:
        self.limits = limits
        self.where = where
        self.total = 0

    def spend(self, size: int) -> None:
        self.total += size
        if self.total > self.limits.repo_bytes:
            raise SourceError(
                f"the policy files of {self.where} hold more than "
                f"{_amount(self.limits.repo_bytes)}, the limit for one repository "
                "(AGENTAUTH_MAX_POLICY_REPO_BYTES); nothing was read"
            )


def _amount(size: int) -> str:
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor and size % factor == 0:
            return f"{size // factor} {unit}"
    return f"{size:,} bytes"


def _refused(path: str, reason: str) -> SourceFile:
    return SourceFile(path, b"", refused=reason)


# ------------------------------------------------------------------------------- directory


def read_files(directory: Path, limits: ReadLimits | None = None) -> list[SourceFile]:
    """The policy files under ``directory``, sorted by path, hidden files and folders
    skipped, within ``limits`` (the rules are the module's)."""
    if not directory.is_dir():
        raise SourceError(f"{directory} is not a directory")
    try:
        return _read_directory(directory, limits or ReadLimits())
    except OSError as exc:
        where = exc.filename or directory
        raise SourceError(f"cannot read {where}: {exc.strerror or exc}") from None


def _read_directory(directory: Path, limits: ReadLimits) -> list[SourceFile]:
    root = os.path.realpath(directory)  # the root may itself be a link: the operator's choice
    budget = _Budget(limits, str(directory))
    files = []
    # an unreadable folder is an error, not a folder without policies (which would prune them)
    for folder, folders, names in os.walk(root, onerror=_raise):
        folders[:] = sorted(f for f in folders if not f.startswith("."))
        relative = os.path.relpath(folder, root).replace(os.sep, "/")
        prefix = "" if relative == "." else relative + "/"
        # os.walk lists a link to a folder among the folders and never enters it; one named
        # like a policy file is refused as one
        linked = [f for f in folders if os.path.islink(os.path.join(folder, f))]
        for name in [*names, *linked]:
            if is_document_path(prefix + name):
                files.append(_read_file(root, os.path.join(folder, name), prefix + name, budget))
    return sorted(files, key=lambda f: f.path)


def _raise(error: OSError) -> None:
    raise error


def _read_file(root: str, full: str, path: str, budget: _Budget) -> SourceFile:
    """One file, checked before it is opened and again once it is (it may have been swapped
    in between): a regular file, inside ``root``, within the limits."""
    info = os.lstat(full)
    if stat.S_ISLNK(info.st_mode):
        full = os.path.realpath(full)
        refusal = _outside(root, full)
        if refusal is not None:
            return _refused(path, refusal)
        try:
            info = os.stat(full)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                return _refused(path, BROKEN)
            raise
    if not stat.S_ISREG(info.st_mode):
        return _refused(path, f"is not a regular file ({_kind(info.st_mode)}); not read")
    limit = budget.limits.file_bytes
    if info.st_size > limit:
        return _refused(path, budget.limits.too_large())
    # O_NOFOLLOW: ``full`` has no link left to follow; O_NONBLOCK: a FIFO swapped in does not
    # block the open (fstat then refuses it)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    handle = os.open(full, flags | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        opened = os.fstat(handle)
        if (
            not stat.S_ISREG(opened.st_mode)
            or (opened.st_dev, opened.st_ino) != (info.st_dev, info.st_ino)
            or _outside(root, _opened_path(handle) or full) is not None
        ):
            return _refused(path, "changed while it was being read; not read")
        content = _read_at_most(handle, limit + 1)
    finally:
        os.close(handle)
    budget.spend(len(content))
    if len(content) > limit:
        return _refused(path, budget.limits.too_large())
    return SourceFile(path, content)


def _outside(root: str, target: str) -> str | None:
    """Why a link resolved to ``target`` (a real path) is refused, if it is."""
    try:
        relative = os.path.relpath(target, root)
    except ValueError:  # another drive
        return LEAVES
    parts = relative.split(os.sep)
    if parts[0] == os.pardir or os.path.isabs(relative):
        return LEAVES
    if relative != os.curdir and any(part.startswith(".") for part in parts):
        return HIDDEN
    return None


def _opened_path(handle: int) -> str | None:
    """The real path of an open file, where the system tells it (Linux)."""
    try:
        return os.readlink(f"/proc/self/fd/{handle}")
    except OSError:
        return None


def _read_at_most(handle: int, size: int) -> bytes:
    chunks = []
    while size > 0:
        chunk = os.read(handle, min(size, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _kind(mode: int) -> str:
    kinds = (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symbolic link"),
    )
    return next((name for test, name in kinds if test(mode)), f"mode {stat.S_IFMT(mode):o}")


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


# ------------------------------------------------------------------------------------- git


def open_repository(path: Path) -> git.Repo:
    import git

    try:
        return git.Repo(path, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise SourceError(f"{path} is not inside a git repository") from None


def read_revision(
    repo: git.Repo,
    revision: str,
    subdir: str = "",
    *,
    missing_ok: bool = False,
    limits: ReadLimits | None = None,
) -> list[SourceFile]:
    """The policy files under ``subdir`` at ``revision`` (any rev-parse expression), read from
    the object database within ``limits`` (the rules are the module's; ``subdir`` is the
    repository root). Paths are relative to ``subdir``. A ``subdir`` missing at that
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
        if not isinstance(tree, git.Tree):
            raise SourceError(f"'{prefix}' is not a folder at revision '{revision}'")
    budget = _Budget(limits or ReadLimits(), f"'{prefix or '.'}' at revision '{revision}'")
    root = prefix.parts if prefix else ()
    files = []
    for item in tree.traverse():
        if not isinstance(item, git.Blob | git.Submodule):
            continue
        full = str(item.path)  # from the commit's root
        path = PurePosixPath(full).relative_to(prefix).as_posix() if prefix else full
        if is_document_path(path):
            files.append(_read_blob(commit.tree, item, root, path, budget))
    return sorted(files, key=lambda f: f.path)


def _read_blob(
    top: git.Tree, item: object, root: tuple[str, ...], path: str, budget: _Budget
) -> SourceFile:
    """One file of a commit: a regular blob, or a link resolved in the commit's tree to a
    regular blob under ``root``, within the limits."""
    import git

    if not isinstance(item, git.Blob):
        return _refused(path, SUBMODULE)
    blob = item
    if stat.S_ISLNK(item.mode):
        found = _resolve_link(top, str(item.path))
        if isinstance(found, str):
            return _refused(path, found)
        parts, target = found
        if parts[: len(root)] != root:
            return _refused(path, LEAVES)
        if any(part.startswith(".") for part in parts[len(root) :]):
            return _refused(path, HIDDEN)
        if isinstance(target, git.Tree):
            return _refused(path, "is not a regular file (a folder); not read")
        if not isinstance(target, git.Blob):
            return _refused(path, SUBMODULE)
        blob = target
    limit = budget.limits.file_bytes
    if blob.size > limit:  # the object's header: nothing of it is read
        return _refused(path, budget.limits.too_large())
    content = blob.data_stream.read()
    budget.spend(len(content))
    return SourceFile(path, content)


def _resolve_link(top: git.Tree, link: str) -> tuple[tuple[str, ...], object] | str:
    """Where the link at ``link`` leads in the tree ``top``, as realpath would on a checkout
    (every link on the way followed, ``..`` applied to what they resolved to): the path's
    parts and the object there; or why it is refused."""
    import git

    pending = deque(link.split("/"))
    parts: list[str] = []
    trail: list[object] = [top]
    followed = 0
    while pending:
        part = pending.popleft()
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                return LEAVES
            parts.pop()
            trail.pop()
            continue
        here = trail[-1]
        if not isinstance(here, git.Tree):
            return BROKEN  # a path through a file
        try:
            child = here[part]
        except KeyError:
            return BROKEN
        if isinstance(child, git.Blob) and stat.S_ISLNK(child.mode):
            followed += 1
            if followed > MAX_LINKS or child.size > _MAX_LINK_BYTES:
                return BROKEN
            target = child.data_stream.read().decode("utf-8", "surrogateescape")
            if target.startswith("/"):
                return LEAVES
            pending.extendleft(reversed(target.split("/")))
            continue
        parts.append(part)
        trail.append(child)
    return tuple(parts), trail[-1]
