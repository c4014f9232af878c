"""YAML text -> plain JSON-like values that know where they were written, under our bounds: the
one place a policy file's text is read. Called by ``controller.load``; its one reason to change
is how YAML text becomes values.

PyYAML reads: libyaml scans, parses and composes the node tree (PyYAML's own code where it was
built without libyaml), and PyYAML's YAML 1.1 core-schema resolver and safe constructors type
every scalar. What this module adds is what PyYAML does not promise:

- a duplicate mapping key is an error (PyYAML keeps the last one silently);
- aliases may not expand to more than :data:`MAX_ALIAS_NODES` nodes (no "billion laughs"), nor
  contain themselves;
- nothing nests deeper than :data:`MAX_DEPTH`, refused in the same words whichever PyYAML
  release is installed;
- values are JSON values: mapping keys are the text written (``on:`` stays ``"on"``), unquoted
  timestamps stay the text written, and scalars other than strings, integers, floats, booleans
  and null are refused, merge keys (``<<``) and custom tags included (a tag on a list or a
  mapping is not looked at);
- every value and every key has a 1-based (line, column), so problems point at the node.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import yaml

#: alias expansion bound for one file (nodes built from aliases, counted with their children)
MAX_ALIAS_NODES = 1000
#: nesting bound for one document (the API bounds request bodies the same way)
MAX_DEPTH = 64
#: nodes this deep or shallower always get a position (spec.cases[0].policy is 4 deep): the
#: ones checks across documents point at, and all a cache entry keeps
SHALLOW = 4
#: a file with fewer characters that can open a level ([ { - ? : and line breaks) than this
#: cannot nest deeper, so libyaml's composer (recursive in C) is safe on it; past it, the depth
#: is measured on the event stream first (libyaml's parser keeps its own stack)
_SAFE_TO_COMPOSE = 10_000
#: how many distinct scalars each memo keeps: a repository writes the same keys and values
#: (``type``, ``tools``, ``8``) thousands of times, its names and patterns once each
_MEMO = 4096

_MERGE = "tag:yaml.org,2002:merge"
#: scalars read as the text written, timestamps included (JSON Schema never sees a datetime)
_TEXT = frozenset(f"tag:yaml.org,2002:{kind}" for kind in ("str", "timestamp"))
#: PyYAML's safe constructors of the other scalars a value may be
_CONSTRUCTORS = {
    tag: yaml.constructor.SafeConstructor.yaml_constructors[tag]
    for tag in (f"tag:yaml.org,2002:{kind}" for kind in ("int", "float", "bool", "null"))
}
_CONSTRUCTOR = yaml.constructor.SafeConstructor()


class YamlError(ValueError):
    """Text that is not read: the message is a Problem's, at a 1-based (line, column)."""

    def __init__(self, message: str, line: int, column: int) -> None:
        super().__init__(message)
        self.line = line
        self.column = column


@dataclass(frozen=True)
class Values:
    """A document's value, and the (line, column) of each formatted JSON path
    (``spec.rules[0].type``): of its value in ``positions``, of its key in ``keys``."""

    body: Any
    positions: dict[str, tuple[int, int]]
    keys: dict[str, tuple[int, int]]


@dataclass(frozen=True)
class YamlDocument:
    """One composed document of a file: where it starts, and its values when asked."""

    node: yaml.Node
    line: int
    column: int
    #: whether the file may hold aliases (only after an anchor, ``&``): if not, no node is met
    #: twice and the alias bookkeeping is skipped
    anchors: bool

    def values(self, *, full: bool) -> Values:
        """The document's value with positions: of every node when ``full``, else only down
        to :data:`SHALLOW` (a clean file needs no more, and most files are clean)."""
        builder = _Builder(full, self.anchors)
        body = builder.build(self.node, "", 0)
        return Values(body, builder.positions, builder.keys)


def read_documents(text: str) -> list[YamlDocument]:
    """The documents of ``text``, composed; :class:`YamlError` when it is not valid YAML or
    nests too deep to compose safely."""
    try:
        too_deep = _too_deep(text)
        if too_deep is not None:
            raise YamlError(f"nests more than {MAX_DEPTH} levels deep", *too_deep)
        nodes = list(yaml.compose_all(text, Loader=_Composer))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        # a PyYAML release may refuse deep nesting itself, in its own words (6.0.4 stops at
        # 1,000 flow levels while it looks ahead for a key): what it read before refusing is
        # measured by our bound, so the refusal reads the same on every release
        too_deep = _deep_node(_text_before(text, line, column), complete=False)
        if too_deep is not None:
            raise YamlError(f"nests more than {MAX_DEPTH} levels deep", *too_deep) from None
        reason = " ".join(str(part) for part in (exc.context, exc.problem) if part)
        raise YamlError(f"is not valid YAML: {reason}", line, column) from None
    except yaml.YAMLError as exc:
        raise YamlError(f"is not valid YAML: {exc}", 1, 1) from None
    anchors = "&" in text
    return [YamlDocument(node, *_mark(node), anchors) for node in nodes if node is not None]


#: PyYAML's resolver, memoized: the composer asks it for the tag of every node, keys included,
#: and runs its patterns in Python (figures: bench/RESULTS.md, part 4, "One YAML reader")
_resolve = functools.lru_cache(maxsize=_MEMO)(yaml.resolver.Resolver().resolve)


class _Composer(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """libyaml's composer (PyYAML's own where it was built without libyaml) with PyYAML's
    resolver, memoized."""

    resolve = staticmethod(_resolve)


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


class _Builder:
    """Plain values from a composed node tree, recording positions as it goes: of every node
    when ``full``, else only down to :data:`SHALLOW`."""

    def __init__(self, full: bool, aliases: bool) -> None:
        self.full = full
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
            if key_node.tag == _MERGE:
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


def _scalar(node: yaml.ScalarNode) -> Any:
    """A scalar value: text for strings and timestamps, PyYAML's safe constructor's value for
    integers, floats, booleans and null; any other tag is refused."""
    tag, text = node.tag, node.value
    if tag in _TEXT:  # most values
        return text
    if tag not in _CONSTRUCTORS:
        raise YamlError(f"the tag {tag} is not allowed here", *_mark(node))
    try:
        return _construct(tag, text)
    except (ValueError, KeyError, IndexError):  # PyYAML's words for text its tag cannot read
        shown = text if len(text) <= 40 else text[:37] + "..."  # an int of 5,000 digits...
        kind = tag.rsplit(":", 1)[-1]
        raise YamlError(f"the value {shown!r} is not a valid {kind}", *_mark(node)) from None


@functools.lru_cache(maxsize=_MEMO)
def _construct(tag: str, text: str) -> Any:
    """PyYAML's safe constructor for ``tag``, memoized: the same integers recur everywhere."""
    return _CONSTRUCTORS[tag](_CONSTRUCTOR, yaml.ScalarNode(tag, text))
