"""Loading a policy repository: YAML files -> documents that know where each of their values
came from, plus every problem of each document on its own (schema, rule semantics).

The YAML text is read by ``controller.yaml_reader`` (strictly: duplicate keys, aliases and
nesting bounded, JSON values only, every node located). Per-file work is cached by content hash
(``controller.cache``), so a second ``plan`` parses and validates only the files that changed.
Called by ``controller.cache`` and ``controller.repo``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from controller.yaml_reader import YamlError, read_documents
from core.domain.redaction import HOLDS_A_KEY, key_places
from core.domain.rules import check_rules
from schemas import Problem, check, format_path

KINDS = ("Agent", "Policy", "PolicyTest")
#: the YAML suffixes read as documents; hidden files and folders (.git, .github) are skipped
SUFFIXES = (".yaml", ".yml")
_STRIP_LAST = re.compile(r"(\[\d+\]|\.[^.\[\]]*|^[^.\[\]]+)$")


@dataclass(frozen=True)
class SourceFile:
    """One file of a repository: its path relative to the repository root (POSIX form) and
    its bytes; or, when ``controller.sources`` refused to read it (a link leaving the
    repository, not a regular file, too large), why, and no bytes: then the file is that one
    problem."""

    path: str
    content: bytes
    refused: str | None = None

    @property
    def digest(self) -> str:
        if self.refused is not None:  # never the digest of a file's bytes
            return "refused:" + hashlib.sha256(self.refused.encode()).hexdigest()
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


# ---------------------------------------------------------------------------------- parsing


def parse_file(source: SourceFile) -> LoadedFile:
    """Parse and check one file: every document's schema and rule problems, located."""
    if source.refused is not None:
        return _failed(source, source.refused, 1, 1)
    try:
        text = source.content.decode("utf-8")
    except UnicodeDecodeError as exc:
        return _failed(source, f"is not UTF-8 text (byte {exc.start})", 1, 1)
    try:
        yaml_documents = read_documents(text)
    except YamlError as exc:
        return _failed(source, str(exc), exc.line, exc.column)
    documents: list[Document] = []
    problems: list[Problem] = []
    for index, yaml_document in enumerate(yaml_documents):
        line, column = yaml_document.line, yaml_document.column
        try:
            values = yaml_document.values(full=False)
        except YamlError as exc:
            problems.append(Problem(source.path, exc.line, "$", str(exc), exc.column))
            continue
        body = values.body
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
        document = Document(source.path, index, line, column, body, values.positions, values.keys)
        found = check_document(document)
        if found:  # locate them precisely: build again recording every node's position
            values = yaml_document.values(full=True)
            document = Document(
                source.path, index, line, column, body, values.positions, values.keys
            )
            found = check_document(document)
        documents.append(document)
        problems += found
    return LoadedFile(source.path, source.digest, tuple(documents), tuple(sorted(problems)))


def _failed(source: SourceFile, message: str, line: int, column: int) -> LoadedFile:
    return LoadedFile(
        source.path, source.digest, (), (Problem(source.path, line, "$", message, column),)
    )


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
    if kind in _STORED:
        problems += _keys(document)
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


#: the kinds whose documents are stored, and shown again by the API (a PolicyTest's calls are not)
_STORED = ("Agent", "Policy")


def _keys(document: Document) -> list[Problem]:
    """An API key of this service anywhere in the document (a string, a member's name):
    refused, as the API refuses it in a body (a key is never stored or shown)."""
    return [
        document.problem(format_path(place), HOLDS_A_KEY) for place in key_places(document.body)
    ]


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


def is_document_path(path: str) -> bool:
    """Whether a repository path is read as a policy file (the rule of every source in
    ``controller.sources``)."""
    parts = path.split("/")
    return path.endswith(SUFFIXES) and not any(part.startswith(".") for part in parts)
