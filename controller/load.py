"""Loading a policy repository: YAML files -> documents that know where each of their values
came from, plus every problem of each document on its own (schema, rule semantics).

YAML is read safely and strictly: libyaml composes the node tree (no Python objects, no tags
beyond the core schema), and this module builds plain JSON-like values from it, so that

- a duplicate mapping key is an error (PyYAML keeps the last one silently);
- aliases may not expand to more than :data:`MAX_ALIAS_NODES` nodes (no "billion laughs");
- mapping keys are always the text written (``on:`` stays ``"on"``), and unquoted timestamps
  stay strings (JSON Schema and the engine never see a ``datetime``);
- every value and every key has a (line, column), so problems point at the offending node.

Per-file work is cached by content hash (``controller.cache``), so a second ``plan`` parses and
validates only the files that changed. Called by ``controller.cache`` and ``controller.repo``.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from core.domain.rules import check_rules
from schemas import Problem, check, format_path

KINDS = ("Agent", "Policy", "PolicyTest")
#: alias expansion bound for one file (nodes built from aliases, counted with their children)
MAX_ALIAS_NODES = 1000
#: nesting bound for one document (the API bounds request bodies the same way)
MAX_DEPTH = 64
#: a file with fewer characters that can open a level ([ { - ? : and line breaks) than this
#: cannot nest deeper, so libyaml's composer (recursive in C) is safe on it; past it, the depth
#: is measured on the event stream first (libyaml's parser keeps its own stack)
_SAFE_TO_COMPOSE = 10_000
#: the YAML suffixes read as documents; hidden files and folders (.git, .github) are skipped
SUFFIXES = (".yaml", ".yml")

#: the tag a plain (unquoted, untagged) scalar gets from :class:`_Composer`; the builder types
#: it (:func:`_tag`), only for values: keys are always the text written
_PLAIN = "?plain"


class _Composer(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """libyaml's composer (PyYAML's own where it was built without libyaml) without PyYAML's
    resolver, which costs about 40% of composing a policy file: it would type every scalar,
    keys included, in Python."""

    def resolve(self, kind: type, value: Any, implicit: tuple[bool, bool]) -> str:
        if kind is yaml.ScalarNode:
            return _PLAIN if implicit[0] else _STR
        return _SEQ if kind is yaml.SequenceNode else _MAP

    def descend_resolver(self, *_: Any) -> None:
        return None

    def ascend_resolver(self, *_: Any) -> None:
        return None


_STR, _SEQ, _MAP, _MERGE = ("tag:yaml.org,2002:" + kind for kind in ("str", "seq", "map", "merge"))
#: PyYAML's core-schema resolvers by a plain scalar's first character ("" for an empty one)
_IMPLICIT = {
    first: tuple(resolvers) + tuple(yaml.resolver.Resolver.yaml_implicit_resolvers.get(None, ()))
    for first, resolvers in yaml.resolver.Resolver.yaml_implicit_resolvers.items()
    if first is not None
}
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
        too_deep = _too_deep(text)
        if too_deep is not None:
            return _failed(source, f"nests more than {MAX_DEPTH} levels deep", *too_deep)
        nodes = list(yaml.compose_all(text, Loader=_Composer))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        # a PyYAML release may refuse deep nesting itself, in its own words (6.0.4 stops at
        # 1,000 flow levels while it looks ahead for a key): what it read before refusing is
        # measured by our bound, so the refusal reads the same on every release
        too_deep = _deep_node(_text_before(text, line, column), complete=False)
        if too_deep is not None:
            return _failed(source, f"nests more than {MAX_DEPTH} levels deep", *too_deep)
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
            builder = _Builder(full=False, aliases="&" in text)
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
            builder = _Builder(full=True, aliases="&" in text)
            builder.build(node, "", 0)
            document = Document(
                source.path, index, line, column, body, builder.positions, builder.keys
            )
            found = check_document(document)
        documents.append(document)
        problems += found
    return LoadedFile(source.path, source.digest, tuple(documents), tuple(sorted(problems)))


def _too_deep(text: str) -> tuple[int, int] | None:
    """Where a file nests past :data:`MAX_DEPTH`, for files that could nest deep enough to
    overflow the composer's C stack; None otherwise (the builder bounds the rest)."""
    if sum(text.count(opener) for opener in "[{-?:\n") < _SAFE_TO_COMPOSE:
        return None
    return _deep_node(text, complete=True)


def _deep_node(text: str, *, complete: bool) -> tuple[int, int] | None:
    """The (line, column) of the first node nested past :data:`MAX_DEPTH`, measured on the
    event stream (libyaml's parser keeps its own stack). ``complete=False`` reads a text cut
    short: the error at its end is no news, and only the events before it count."""
    depth = 0  # collections open around the next node, as the builder counts its depth
    try:
        for event in yaml.parse(text, Loader=_Composer):
            if isinstance(event, yaml.NodeEvent) and depth > MAX_DEPTH:
                mark = event.start_mark
                return (mark.line + 1, mark.column + 1) if mark else (1, 1)
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.YAMLError:
        if complete:
            raise
    return None


def _text_before(text: str, line: int, column: int) -> str:
    """``text`` up to the 1-based (line, column) a YAML error points at (all of it when the
    mark counts line breaks that ``\\n`` does not, such as a lone ``\\r``)."""
    lines = text.split("\n", line - 1)
    if len(lines) < line:
        return text
    return "\n".join([*lines[: line - 1], lines[line - 1][: column - 1]])


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

    def __init__(self, full: bool, aliases: bool = True) -> None:
        self.full = full
        #: whether the text may hold aliases (only after an anchor, ``&``): if not, no node is
        #: met twice and the alias bookkeeping is skipped
        self.aliases = aliases
        self.positions: dict[str, tuple[int, int]] = {}
        self.keys: dict[str, tuple[int, int]] = {}
        self._expanded = 0
        self._active: set[int] = set()
        self._seen: set[int] = set()

    def build(self, node: yaml.Node, path: str, depth: int) -> Any:
        """``path`` is the node's formatted JSON path (``spec.rules[0]``), built as the tree is
        walked so every node costs one string, not a formatting of its whole path; "" below
        the depth where positions are recorded. The hot path of loading: kept lean."""
        if self.aliases:
            self._count(node)
        if depth > MAX_DEPTH:
            raise YamlError(f"nests more than {MAX_DEPTH} levels deep", *_mark(node))
        if depth <= SHALLOW or self.full:
            mark = node.start_mark
            self.positions.setdefault(path, (mark.line + 1, mark.column + 1))
        if isinstance(node, yaml.ScalarNode):
            return _scalar(node)
        kind = type(node)
        if not self.aliases:
            return self._collection(node, kind, path, depth)
        ident = id(node)
        self._active.add(ident)
        try:
            return self._collection(node, kind, path, depth)
        finally:
            self._active.discard(ident)

    def _count(self, node: yaml.Node) -> None:
        """Refuse a recursive alias, and aliases expanding past the bound."""
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

    def _collection(self, node: yaml.Node, kind: type, path: str, depth: int) -> Any:
        recorded = depth < SHALLOW or self.full  # whether the members get positions
        build = self.build
        if kind is yaml.SequenceNode:
            if recorded:
                return [build(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(node.value)]
            return [build(item, "", depth + 1) for item in node.value]
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if type(key_node) is not yaml.ScalarNode:
                raise YamlError("a mapping key must be a plain value", *_mark(key_node))
            key = str(key_node.value)
            if (key == "<<" or key_node.tag == _MERGE) and _tag(key_node) == _MERGE:
                raise YamlError("merge keys (<<) are not supported", *_mark(key_node))
            if key in out:
                raise YamlError(
                    f"duplicate key '{key}' in {path or 'the document'}", *_mark(key_node)
                )
            if recorded:
                member = f"{path}.{key}" if path else key
                mark = key_node.start_mark
                self.keys.setdefault(member, (mark.line + 1, mark.column + 1))
                out[key] = build(value_node, member, depth + 1)
            else:
                out[key] = build(value_node, "", depth + 1)
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


def _tag(node: yaml.ScalarNode) -> str:
    """A scalar's core-schema tag: as PyYAML's resolver would give it, for plain scalars."""
    tag = node.tag
    if tag != _PLAIN:
        return str(tag)
    value = node.value
    for resolved, pattern in _IMPLICIT.get(value[:1], ()):
        if pattern.match(value):
            return str(resolved)
    return _STR


def _scalar(node: yaml.ScalarNode) -> Any:
    """The core-schema value of a scalar; timestamps and binary stay the text written. The
    common forms are converted here; PyYAML's constructor handles the rest (0x1F, 1_000, .inf)
    at many times the cost."""
    tag, text = node.tag, node.value
    if tag == _STR or (tag == _PLAIN and text[:1] not in _IMPLICIT):  # most values: text
        return text
    tag = _tag(node)
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
        typed = yaml.ScalarNode(tag, text, node.start_mark, node.end_mark, node.style)
        return _SCALARS.construct_object(typed, deep=True)
    raise YamlError(f"the tag {tag} is not allowed here", *_mark(node))


# ------------------------------------------------------------------------ per-document checks


def check_document(document: Document) -> list[Problem]:
    """Every problem of one document on its own: the schema, then (when the schema passed)
    rule semantics and the test clock. Cross-document checks live in ``controller.repo``."""
    problems = [document.problem(p.path, p.message) for p in check("document.json", document.body)]
    body = document.body
    kind = body.get("kind")
    spec = body.get("spec")
    if not isinstance(spec, dict) or kind not in KINDS:
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
