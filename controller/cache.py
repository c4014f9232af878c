"""The document cache: parsed and checked policy files by content hash, so planning again
after a change parses and validates only the changed files; and parsing many files at once in
worker processes. Called by ``controller.repo`` and the CLI."""

from __future__ import annotations

import gc
import hashlib
import json
import marshal
import multiprocessing
import os
import re
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from controller import load, yaml_reader
from controller.load import Document, LoadedFile, SourceFile, parse_file
from core.domain.rules import check_rules
from schemas import Problem


class DocumentCache:
    """Parsed and checked files by content hash, kept in one file per repository.

    An entry is valid only for the same bytes and the same version of this code and schemas
    (:func:`cache_version`); anything unreadable is treated as empty. Written atomically. The
    format is ``marshal`` (plain lists, dicts and strings; several times faster to read than
    JSON); the file lives in the user's own cache folder.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._entries: dict[str, Any] = {}
        self._dirty = False
        if path is not None:
            try:
                with paused_gc():
                    # our own cache file in the user's cache folder, same trust as the code
                    data = marshal.loads(path.read_bytes())  # noqa: S302
                if data.get("version") == cache_version():
                    self._entries = data["files"]
            except (OSError, ValueError, KeyError, TypeError, AttributeError, EOFError):
                self._entries = {}

    def load(self, source: SourceFile) -> LoadedFile:
        return self.load_all([source])[0]

    def load_all(self, sources: Sequence[SourceFile]) -> list[LoadedFile]:
        """Every file, from the cache where it holds the same bytes, else parsed and checked
        (in several processes when there are many: the work is CPU-bound and per file)."""
        keys = [f"{s.path}\0{s.digest}" for s in sources]
        with paused_gc():
            found: list[LoadedFile | None] = [self._cached(key) for key in keys]
            missing = [i for i, loaded in enumerate(found) if loaded is None]
            if missing:
                entries = _parse_many([sources[i] for i in missing])
                for i, entry in zip(missing, entries, strict=True):
                    self._entries[keys[i]] = entry
                    found[i] = _from_json(entry)
                self._dirty = True
        return [loaded for loaded in found if loaded is not None]

    def _cached(self, key: str) -> LoadedFile | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        try:
            return _from_json(entry)
        except (KeyError, TypeError, ValueError):
            return None  # an entry of another shape: parse again

    def keep_only(self, sources: Iterable[SourceFile]) -> None:
        wanted = {f"{s.path}\0{s.digest}" for s in sources}
        if set(self._entries) - wanted:
            self._entries = {k: v for k, v in self._entries.items() if k in wanted}
            self._dirty = True

    def save(self) -> None:
        if self.path is None or not self._dirty:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            data = marshal.dumps({"version": cache_version(), "files": self._entries})
            handle, temporary = tempfile.mkstemp(dir=self.path.parent, suffix=".tmp")
            with os.fdopen(handle, "wb") as out:
                out.write(data)
            os.replace(temporary, self.path)
        except OSError:
            return  # a cache that cannot be written only costs time next run


@contextmanager
def paused_gc() -> Iterator[None]:
    """Building a million small objects triggers the cycle collector over and over, each pass
    over every object built so far; documents hold no cycles, so it is paused meanwhile. What
    was built is then frozen (left out of later collections: one more pass over it would cost
    about half a second for 11,000 files); what an earlier call froze is unfrozen first, so a
    long-running watcher's old cycles are still collected eventually."""
    enabled = gc.isenabled()
    gc.disable()
    gc.unfreeze()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


#: below this many files to parse, starting worker processes costs more than it saves
PARALLEL_FROM = 400


def _parse_many(sources: Sequence[SourceFile]) -> list[dict[str, Any]]:
    """Cache entries for ``sources``, in order."""
    workers = min(os.cpu_count() or 1, 8)
    if len(sources) < PARALLEL_FROM or workers < 2:
        return [_to_json(parse_file(source)) for source in sources]
    chunk = max(50, len(sources) // (workers * 4))
    batches = [sources[i : i + chunk] for i in range(0, len(sources), chunk)]
    # fork starts at once, but only a single-threaded process may fork safely (a watcher or
    # a syncer has threads holding locks): spawn then, which imports everything afresh
    alone = threading.active_count() == 1 and "fork" in multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if alone else "spawn")
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        # entries come back marshalled (2 to 3 times cheaper than pickle at both ends), from
        # our own worker processes
        batched = pool.map(_parse_batch, batches)
        return [entry for batch in batched for entry in marshal.loads(batch)]  # noqa: S302


def _parse_batch(sources: Sequence[SourceFile]) -> bytes:
    with paused_gc():
        return marshal.dumps([_to_json(parse_file(source)) for source in sources])


def cache_version() -> str:
    """Changes whenever this module, the loader, the YAML reader, the rule checks or any
    schema changes."""
    global _VERSION
    if _VERSION is None:
        digest = hashlib.sha256(Path(__file__).read_bytes())
        digest.update(Path(load.__file__).read_bytes())
        digest.update(Path(yaml_reader.__file__).read_bytes())
        import schemas

        for name in schemas.FILES:
            digest.update(json.dumps(schemas.load_schema(name), sort_keys=True).encode())
        rules = Path(check_rules.__code__.co_filename)
        digest.update(rules.read_bytes())
        _VERSION = digest.hexdigest()[:16]
    return _VERSION


_VERSION: str | None = None


def _to_json(loaded: LoadedFile) -> dict[str, Any]:
    return {
        "path": loaded.path,
        "digest": loaded.digest,
        "documents": [
            [d.index, d.line, d.column, d.body, _kept(d.positions), _kept(d.keys)]
            for d in loaded.documents
        ],
        "problems": [[p.line, p.path, p.message, p.column, p.severity] for p in loaded.problems],
    }


#: the paths a cached document keeps positions for: those that checks across documents point
#: at (names, references, a rule, a test case's member). A cached file's own problems are
#: cached with their positions already, so deeper paths are never needed again.
_KEPT = re.compile(r"(apiVersion|kind|metadata(\.\w+)?|spec(\.\w+)?(\[\d+\](\.\w+)?)?)")


def _kept(positions: Mapping[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    return {path: at for path, at in positions.items() if _KEPT.fullmatch(path)}


def _from_json(entry: dict[str, Any]) -> LoadedFile:
    """The entry's file; the shapes are trusted (an entry written by another version of this
    module is never read: see :func:`cache_version`), the containers copied."""
    path = entry["path"]
    documents = tuple(
        Document(path, index, line, column, dict(body), dict(positions), dict(keys))
        for index, line, column, body, positions, keys in entry["documents"]
    )
    problems = tuple(Problem(path, *problem) for problem in entry["problems"])
    return LoadedFile(path, entry["digest"], documents, problems)
