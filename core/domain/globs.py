"""Tool-name glob patterns: a rule's ``tools`` list turned into one fast predicate.

Called by :func:`core.domain.compiler.compile_policy`, once per rule when policies are compiled; the
predicate it returns then runs on every authorization check, so each pattern is analysed here
once and matched later without allocating.

Semantics (decisions §2): a pattern matches the *whole* tool name, case-sensitively. ``*``
matches any run of characters, dots and the empty run included; ``?`` matches exactly one
character; every other character, ``[`` and ``]`` included, is literal. A ``tools`` list that
is omitted, or holds a pattern made only of ``*``, matches every tool.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

#: A compiled ``tools`` list: called with a tool name, says whether the rule applies to it.
ToolMatcher = Callable[[str], bool]


def is_wildcard(pattern: str) -> bool:
    """Whether ``pattern`` holds a ``*`` or ``?`` (otherwise it is a plain tool name)."""
    return "*" in pattern or "?" in pattern


def compile_tools(patterns: Sequence[str] | None) -> ToolMatcher | None:
    """The predicate for a rule's ``tools``; None means "every tool" (no call needed).

    Patterns are grouped by shape so a list like ``["calendar.*", "mail.*", "search"]`` costs
    one set lookup and one ``str.startswith`` with a tuple, whatever its length.
    """
    if patterns is None or any(p and not p.strip("*") for p in patterns):
        return None
    literals = frozenset(p for p in patterns if not is_wildcard(p))
    wild = [p for p in patterns if is_wildcard(p)]
    prefixes = tuple(p[:-1] for p in wild if _shape(p) == "prefix")
    suffixes = tuple(p[1:] for p in wild if _shape(p) == "suffix")
    globs = tuple(compile_glob(p) for p in wild if _shape(p) == "glob")
    if not wild:
        return literals.__contains__
    if len(globs) == len(wild) == 1 and not literals:
        return globs[0]
    if len(prefixes) == len(wild):  # the usual shape: names and "namespace.*"
        if not literals:
            return lambda name: name.startswith(prefixes)
        return lambda name: name in literals or name.startswith(prefixes)

    def matches_any(name: str) -> bool:
        if name in literals or name.startswith(prefixes) or name.endswith(suffixes):
            return True
        for glob in globs:  # noqa: SIM110 - a plain loop; any() over a generator costs more here
            if glob(name):
                return True
        return False

    return matches_any


def _shape(pattern: str) -> str:
    """``prefix`` for ``abc*``, ``suffix`` for ``*abc`` (one star, no ``?``), else ``glob``."""
    if "?" in pattern or pattern.count("*") != 1:
        return "glob"
    if pattern.endswith("*"):
        return "prefix"
    return "suffix" if pattern.startswith("*") else "glob"


def compile_glob(pattern: str) -> ToolMatcher:
    """The predicate for one pattern, specialised for the common shapes."""
    shape = _shape(pattern)
    if shape == "prefix":
        head = pattern[:-1]
        return lambda name: name.startswith(head)
    if shape == "suffix":
        tail = pattern[1:]
        return lambda name: name.endswith(tail)
    if not is_wildcard(pattern):
        return pattern.__eq__
    return Glob.compile(pattern).matches


@dataclass(frozen=True, slots=True)
class Glob:
    """A pattern split at its stars: ``head*middle[0]*...*tail``.

    Matching anchors ``head`` at the start and ``tail`` at the end, then places each middle
    part at its leftmost fit, in order. Parts have a fixed length (``?`` is one character), so
    the leftmost fit always leaves the most room for the rest: no backtracking is needed, and a
    match costs at most len(name) x len(pattern) character comparisons.
    """

    head: str
    middle: tuple[str, ...]
    tail: str
    has_star: bool
    min_length: int

    @classmethod
    def compile(cls, pattern: str) -> Glob:
        parts = pattern.split("*")
        if len(parts) == 1:
            return cls(pattern, (), "", False, len(pattern))
        middle = tuple(part for part in parts[1:-1] if part)
        return cls(parts[0], middle, parts[-1], True, len(pattern) - len(parts) + 1)

    def matches(self, name: str) -> bool:
        size = len(name)
        if not self.has_star:
            return size == self.min_length and part_at(self.head, name, 0)
        if size < self.min_length:
            return False
        end = size - len(self.tail)
        if not (part_at(self.head, name, 0) and part_at(self.tail, name, end)):
            return False
        position = len(self.head)
        for part in self.middle:
            position = find_part(part, name, position, end)
            if position < 0:
                return False
            position += len(part)
        return True


def part_at(part: str, name: str, position: int) -> bool:
    """Whether star-free ``part`` matches ``name`` at ``position`` (``?`` any one character)."""
    if "?" not in part:
        return name.startswith(part, position)
    if position + len(part) > len(name):
        return False
    for offset, char in enumerate(part):
        if char != "?" and name[position + offset] != char:
            return False
    return True


def find_part(part: str, name: str, start: int, end: int) -> int:
    """Leftmost position in ``name[start:end]`` where ``part`` fits entirely, or -1."""
    if "?" not in part:
        return name.find(part, start, end)
    for position in range(start, end - len(part) + 1):
        if part_at(part, name, position):
            return position
    return -1
