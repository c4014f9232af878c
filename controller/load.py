"""Loading a policy repository: YAML files -> documents that know where each of their values
came from, plus every problem of each document on its own (schema, rule semantics).

YAML is read safely and strictly: libyaml composes the node tree (no Python objects, no tags
beyond the core schema), and this module builds plain JSON-like values from it, so that

- a duplicate mapping key is an error (PyYAML keeps the last one silently);
- aliases may not expand to more than :data:`MAX_ALIAS_NODES` nodes (no "billion laughs");
- mapping keys are always the text written (``on:`` stays ``"on"``), and unquoted timestamps
  stay strings (JSON Schema and the engine never see a ``datetime``);
- every value and every key has a (line, column), so problems point at the offending node.

Per-file work is cached by content hash (:class:`DocumentCache`), so a second ``plan`` parses and
validates only the files that changed. Called by ``controller.repo``.
"""

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
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from core.rules import check_rules
from schemas import Problem, fast_check, format_path, validate

API_VERSION = "agentauth/v1"
KINDS = ("Agent", "Policy", "PolicyTest")
#: alias expansion bound for one file (nodes built from aliases, counted with their children)
MAX_ALIAS_NODES = 1000
#: the YAML suffixes read as documents; hidden files and folders (.git, .github) are skipped
SUFFIXES = (".yaml", ".yml")

_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_STRIP_LAST = re.compile(r"(\[\d+\]|\.[^.\[\]]*|^[^.\[\]]+)$")


@dataclass(frozen=True)
class SourceFile:
    """One file of a repository: its path relative to the repository root (POSIX form) and
    its bytes."""

    path: str
    content: bytes

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.content).hexdigest()


@dataclass(frozen=True)
class Document:
    """One YAML document of a file. ``body`` is the parsed value (a mapping once the file
    loaded). ``positions`` maps each formatted JSON path (``spec.rules[0].type``) to the
    1-based (line, column) of its value; ``keys`` the same for mapping keys."""

    file: str
    index: int
    line: int
    column: int
    body: dict[str, Any]
    positions: Mapping[str, tuple[int, int]] = field(repr=False)
    keys: Mapping[str, tuple[int, int]] = field(repr=False)

    @property
    def kind(self) -> str:
        return str(self.body.get("kind"))

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    @property
    def spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = self.body["spec"]
        return spec

    @property
    def pinned_id(self) -> str | None:
        value = self.body["metadata"].get("id")
        return None if value is None else str(value).lower()

    def locate(self, path: str, *, key: bool = True) -> tuple[int, int]:
        """Where ``path`` is written: the key naming it when there is one (so an unknown field
        points at its key), else its value, else the nearest enclosing node that exists."""
        current = path
        while current:
            if key and current in self.keys:
                return self.keys[current]
            if current in self.positions:
                return self.positions[current]
            stripped = _STRIP_LAST.sub("", current)
            if stripped == current:
                break
            current = stripped
        return self.line, self.column

    def problem(self, path: str, message: str, severity: str = "error") -> Problem:
        line, column = self.locate(path)
        return Problem(self.file, line, path, message, column, severity)


@dataclass(frozen=True)
class LoadedFile:
    """A file's documents and the problems found in them one at a time."""

    path: str
    digest: str
    documents: tuple[Document, ...]
    problems: tuple[Problem, ...]


class YamlError(ValueError):
    def __init__(self, message: str, line: int, column: int) -> None:
        super().__init__(message)
        self.line = line
        self.column = column


# ---------------------------------------------------------------------------------- parsing


def parse_file(source: SourceFile) -> LoadedFile:
    """Parse and check one file: every document's schema and rule problems, located."""
    try:
        text = source.content.decode("utf-8")
    except UnicodeDecodeError as exc:
        return _failed(source, f"is not UTF-8 text (byte {exc.start})", 1, 1)
    try:
        nodes = list(yaml.compose_all(text, Loader=_Loader))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        reason = " ".join(str(part) for part in (exc.context, exc.problem) if part)
        return _failed(source, f"is not valid YAML: {reason}", line, column)
    except yaml.YAMLError as exc:
        return _failed(source, f"is not valid YAML: {exc}", 1, 1)
    documents: list[Document] = []
    problems: list[Problem] = []
    for index, node in enumerate(nodes):
        if node is None:
            continue
        line, column = node.start_mark.line + 1, node.start_mark.column + 1
        try:
            builder = _Builder(full=False)
            body = builder.build(node, "", 0)
        except YamlError as exc:
            problems.append(Problem(source.path, exc.line, "$", str(exc), exc.column))
            continue
        if not isinstance(body, dict):
            what = "a list" if isinstance(body, list) else "a single value"
            problems.append(
                Problem(
                    source.path,
                    line,
                    "$",
                    f"document {index + 1} is {what}; expected a mapping with apiVersion, "
                    "kind, metadata and spec",
                    column,
                )
            )
            continue
        document = Document(source.path, index, line, column, body, builder.positions, builder.keys)
        found = check_document(document)
        if found:  # locate them precisely: build again recording every node's position
            builder = _Builder(full=True)
            builder.build(node, "", 0)
            document = Document(
                source.path, index, line, column, body, builder.positions, builder.keys
            )
            found = check_document(document)
        documents.append(document)
        problems += found
    return LoadedFile(source.path, source.digest, tuple(documents), tuple(sorted(problems)))


def _failed(source: SourceFile, message: str, line: int, column: int) -> LoadedFile:
    return LoadedFile(
        source.path, source.digest, (), (Problem(source.path, line, "$", message, column),)
    )


#: nodes this deep or shallower always get a position (spec.cases[0].policy is 4 deep): the
#: ones checks across documents point at, and all a cache entry keeps
SHALLOW = 4


class _Builder:
    """Plain values from a composed node tree, recording positions as it goes: of every node
    when ``full``, else only down to :data:`SHALLOW` (a clean file needs no more, and most
    files are clean)."""

    def __init__(self, full: bool) -> None:
        self.full = full
        self.positions: dict[str, tuple[int, int]] = {}
        self.keys: dict[str, tuple[int, int]] = {}
        self._expanded = 0
        self._active: set[int] = set()
        self._seen: set[int] = set()

    def build(self, node: yaml.Node, path: str, depth: int) -> Any:
        """``path`` is the node's formatted JSON path (``spec.rules[0]``), built as the tree is
        walked so every node costs one string, not a formatting of its whole path."""
        ident = id(node)
        if ident in self._active:
            raise YamlError("a recursive alias is not allowed", *_mark(node))
        if ident in self._seen:  # an alias: the same node again
            self._expanded += _size(node)
            if self._expanded > MAX_ALIAS_NODES:
                raise YamlError(
                    f"aliases expand to more than {MAX_ALIAS_NODES} nodes", *_mark(node)
                )
        self._seen.add(ident)
        if self.full or depth <= SHALLOW:
            self.positions.setdefault(path, _mark(node))
        if isinstance(node, yaml.ScalarNode):
            return _scalar(node)
        self._active.add(ident)
        try:
            if isinstance(node, yaml.SequenceNode):
                return [
                    self.build(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(node.value)
                ]
            return self._mapping(node, path, depth)
        finally:
            self._active.discard(ident)

    def _mapping(self, node: yaml.Node, path: str, depth: int) -> dict[str, Any]:
        recorded = self.full or depth < SHALLOW
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise YamlError("merge keys (<<) are not supported", *_mark(key_node))
            if not isinstance(key_node, yaml.ScalarNode):
                raise YamlError("a mapping key must be a plain value", *_mark(key_node))
            key = str(key_node.value)
            if key in out:
                raise YamlError(
                    f"duplicate key '{key}' in {path or 'the document'}", *_mark(key_node)
                )
            member = (f"{path}.{key}" if path else key) if recorded else ""
            if recorded:
                self.keys.setdefault(member, _mark(key_node))
            out[key] = self.build(value_node, member, depth + 1)
        return out


def _mark(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


def _size(node: yaml.Node, budget: int = MAX_ALIAS_NODES + 1) -> int:
    """Nodes under ``node`` (counting aliases again), stopping once past ``budget``."""
    count, stack = 0, [node]
    while stack and count <= budget:
        current = stack.pop()
        count += 1
        if isinstance(current, yaml.SequenceNode):
            stack.extend(current.value)
        elif isinstance(current, yaml.MappingNode):
            for key, value in current.value:
                stack.extend((key, value))
    return count


_SCALARS = yaml.SafeLoader("")
_PLAIN_INT = re.compile(r"[-+]?(0|[1-9][0-9]*)")
_BOOLS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}


def _scalar(node: yaml.ScalarNode) -> Any:
    """The core-schema value of a scalar; timestamps and binary stay the text written. The
    common forms are converted here; PyYAML's constructor handles the rest (0x1F, 1_000, .inf)
    at many times the cost."""
    tag, text = node.tag, node.value
    if tag in ("tag:yaml.org,2002:str", "tag:yaml.org,2002:timestamp"):
        return text
    if tag == "tag:yaml.org,2002:int" and _PLAIN_INT.fullmatch(text):
        return int(text)
    if tag == "tag:yaml.org,2002:bool":
        return _BOOLS[text.lower()]
    if tag == "tag:yaml.org,2002:null":
        return None
    if tag in (
        "tag:yaml.org,2002:int",
        "tag:yaml.org,2002:float",
        "tag:yaml.org,2002:bool",
        "tag:yaml.org,2002:null",
    ):
        return _SCALARS.construct_object(node, deep=True)
    raise YamlError(f"the tag {tag} is not allowed here", *_mark(node))


# ------------------------------------------------------------------------ per-document checks

_SPEC_REFS = {
    "Agent": "agent.json#/$defs/spec",
    "Policy": "policy.json#/$defs/spec",
    "PolicyTest": "document.json#/$defs/policyTestSpec",
}


def check_document(document: Document) -> list[Problem]:
    """Every problem of one document on its own: the schema, then (when the schema passed)
    rule semantics and the test clock. Cross-document checks live in ``controller.repo``."""
    quick = fast_check("document.json")  # exact yes/no; the full validator only on a no
    valid = quick is not None and quick(document.body)
    found = [] if valid else validate("document.json", document.body)
    problems = [document.problem(p.path, p.message) for p in found]
    body = document.body
    kind = body.get("kind")
    spec = body.get("spec")
    if not isinstance(spec, dict) or kind not in _SPEC_REFS:
        return problems
    if kind == "Policy":  # check_rules skips what the schema refused, so both always run
        for p in check_rules(spec.get("rules", []), ("spec", "rules")):
            problems.append(document.problem(p.path, p.message))
        if not problems:
            problems += _regex_warnings(document)
    if kind == "PolicyTest" and not problems and not _is_instant(spec["now"]):
        problems.append(
            document.problem(
                "spec.now",
                "must be an ISO 8601 date-time with an offset or Z, e.g. 2026-03-02T09:00:00Z",
            )
        )
    return problems


def _is_instant(text: str) -> bool:
    """A full date-time with an explicit offset: a test's clock must not depend on a guess."""
    try:
        return "T" in text.upper() and datetime.fromisoformat(text).tzinfo is not None
    except ValueError:
        return False


_ANCHORED_START = ("^", "\\A")
_ANCHORED_END = ("$", "\\z")


def _regex_warnings(document: Document) -> list[Problem]:
    out = []
    for index, rule in enumerate(document.spec.get("rules", [])):
        for name, constraint in (rule.get("parameters") or {}).items():
            pattern = constraint.get("regex")
            if not isinstance(pattern, str):
                continue
            if not pattern.startswith(_ANCHORED_START) or not pattern.endswith(_ANCHORED_END):
                path = format_path(("spec", "rules", index, "parameters", name, "regex"))
                out.append(
                    document.problem(
                        path,
                        "regex is not anchored: it matches anywhere in the value; "
                        "write ^...$ unless a substring match is meant",
                        "warning",
                    )
                )
    return out


# ------------------------------------------------------------------------------------ files


def read_directory(root: Path) -> list[SourceFile]:
    """The YAML files under ``root``, sorted by path, hidden files and folders skipped."""
    files = []
    base = str(root)
    for directory, folders, names in os.walk(base):
        folders[:] = sorted(f for f in folders if not f.startswith("."))
        relative = os.path.relpath(directory, base).replace(os.sep, "/")
        prefix = "" if relative == "." else relative + "/"
        for name in names:
            if name.startswith(".") or not name.endswith(SUFFIXES):
                continue
            with open(os.path.join(directory, name), "rb") as handle:
                files.append(SourceFile(prefix + name, handle.read()))
    return sorted(files, key=lambda f: f.path)


def is_document_path(path: str) -> bool:
    """Whether a repository path is read as a policy file (the rule of read_directory)."""
    parts = path.split("/")
    return path.endswith(SUFFIXES) and not any(part.startswith(".") for part in parts)


# ------------------------------------------------------------------------------------ cache


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
    over every object built so far; documents hold no cycles, so it is paused meanwhile."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
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
        return [entry for batch in pool.map(_parse_batch, batches) for entry in batch]


def _parse_batch(sources: Sequence[SourceFile]) -> list[dict[str, Any]]:
    with paused_gc():
        return [_to_json(parse_file(source)) for source in sources]


def cache_version() -> str:
    """Changes whenever this module or any schema file changes."""
    global _VERSION
    if _VERSION is None:
        digest = hashlib.sha256(Path(__file__).read_bytes())
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
            [d.index, d.line, d.column, d.body, _pairs(d.positions), _pairs(d.keys)]
            for d in loaded.documents
        ],
        "problems": [[p.line, p.column, p.path, p.message, p.severity] for p in loaded.problems],
    }


#: the paths a cached document keeps positions for: those that checks across documents point
#: at (names, references, a rule, a test case's member). A cached file's own problems are
#: cached with their positions already, so deeper paths are never needed again.
_KEPT = re.compile(r"(apiVersion|kind|metadata(\.\w+)?|spec(\.\w+)?(\[\d+\](\.\w+)?)?)")


def _pairs(positions: Mapping[str, tuple[int, int]]) -> list[Any]:
    return [
        [path, line, column] for path, (line, column) in positions.items() if _KEPT.fullmatch(path)
    ]


def _from_json(entry: dict[str, Any]) -> LoadedFile:
    path = str(entry["path"])
    documents = tuple(
        Document(
            path,
            int(index),
            int(line),
            int(column),
            dict(body),
            {str(p): (int(ln), int(col)) for p, ln, col in positions},
            {str(p): (int(ln), int(col)) for p, ln, col in keys},
        )
        for index, line, column, body, positions, keys in entry["documents"]
    )
    problems = tuple(
        Problem(path, int(line), str(at), str(message), int(column), str(severity))
        for line, column, at, message, severity in entry["problems"]
    )
    return LoadedFile(path, str(entry["digest"]), documents, problems)
