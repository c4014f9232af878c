"""Unreachable rules: rules a higher-priority policy of the same agent always decides first.

Called by :mod:`controller.repo` for each agent of a repository; ``agentauth validate`` (and
every verb that loads a repository) prints the result as warnings. Pure: plain values in, plain
values out, no IO.

Why a rule can be unreachable (decisions §1, :func:`core.domain.engine.evaluate`): enabled policies
are walked in descending priority, and a policy with an in-scope ``tool_allowlist`` or
``tool_denylist`` rule always ends evaluation (a deny by one of its rules, a grant, or a
rate-limit deny when the grant meets an exhausted limit). So a rule R of policy P is never
reached when, for every tool R can be in scope for, some enabled policy with a *strictly*
higher priority than P has such a rule in scope. Equal priorities do not count: their order
depends on createdAt and id, which a repository does not fix. Rules that only check
(``parameter_constraint``, ``time_based``, ``rate_limit``) do not decide when they pass, so a
policy made only of them shadows nothing. Disabled policies neither shadow nor are reported.
Modes (decisions §10): a warn or shadow policy never decides a real call, so it makes no
enforced policy's rule unreachable; its own rules are walked in the would-be decision, with
every enabled policy, so any policy of higher priority can make them unreachable.

Limitation: R's patterns are checked one by one, each against single higher patterns
(:func:`glob_covers`). Patterns of different policies together cover R when each of R's patterns
is covered by one of them (``[payments.refund, email.send]`` by ``payments.*`` and ``email.*``),
but a pattern covered only by a union of patterns (``a*`` by ``a`` and ``a?*``) is not found:
the lint may miss such a rule, it never reports a reachable one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from core.domain.globs import compile_glob, is_wildcard

_DECIDING = frozenset({"tool_allowlist", "tool_denylist"})
_EVERY_TOOL = ("*",)
#: (s position, g positions, at least one character read) triples explored by
#: :func:`glob_covers` before it gives up and answers False (still sound).
_MAX_STATES = 20_000


@dataclass(frozen=True)
class LintPolicy:
    """One policy of the agent, as a repository declares it."""

    name: str
    priority: int
    enabled: bool
    rules: Sequence[Mapping[str, Any]]  # as the policy JSON schema shapes them
    #: only enforced policies decide calls; warn and shadow ones decide the would-be decision,
    #: with every enabled policy (decisions §10)
    mode: str = "enforce"


@dataclass(frozen=True)
class Shadow:
    """Rule ``rule_index`` of policy ``policy`` is never reached.

    ``by`` holds ``(name, priority)`` of the policies that decide its tools first, sorted and
    unique: for each of the rule's patterns, the highest-priority policy covering it (ties go
    to the smaller name).
    """

    policy: str
    rule_index: int
    by: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class _Decider:
    name: str
    priority: int
    patterns: tuple[str, ...]  # tools of its tool_allowlist and tool_denylist rules
    enforced: bool = True


def shadowed_rules(policies: Sequence[LintPolicy]) -> list[Shadow]:
    """The unreachable rules among ONE agent's policies, sorted by (policy, rule_index)."""
    enabled = [policy for policy in policies if policy.enabled]
    deciders = [_decider(policy) for policy in enabled]
    # highest priority first, ties by name: the first decider covering a pattern is the one
    # a warning names
    deciders = sorted(
        (decider for decider in deciders if decider.patterns),
        key=lambda decider: (-decider.priority, decider.name),
    )
    covers: dict[tuple[int, str], bool] = {}  # (decider index, pattern): covered
    out = []
    for policy in enabled:
        # an enforced policy's rules are reached unless an enforced policy decides first; a
        # warn or shadow policy's, in the would-be decision, unless any policy does
        trial = policy.mode != "enforce"
        higher = [
            i
            for i, decider in enumerate(deciders)
            if decider.priority > policy.priority and (trial or decider.enforced)
        ]
        if not higher:
            continue
        for index, rule in enumerate(policy.rules):
            by = _covered_by(_patterns(rule), higher, deciders, covers)
            if by:
                out.append(Shadow(policy.name, index, by))
    return sorted(out, key=lambda shadow: (shadow.policy, shadow.rule_index))


def shadow_message(shadow: Shadow) -> str:
    """A one-line message for a warning about ``shadow`` (the caller names the rule)."""
    named = [f"'{name}' (priority {priority})" for name, priority in shadow.by]
    if len(named) == 1:
        return f"never reached: policy {named[0]} always decides these tools first"
    listed = ", ".join(named[:-1]) + f" and {named[-1]}"
    return f"never reached: policies {listed} together always decide these tools first"


def _patterns(rule: Mapping[str, Any]) -> tuple[str, ...]:
    """A rule's tool patterns; tools omitted means every tool."""
    tools = rule.get("tools")
    return _EVERY_TOOL if tools is None else tuple(tools)


def _decider(policy: LintPolicy) -> _Decider:
    patterns = [
        pattern
        for rule in policy.rules
        if rule.get("type") in _DECIDING
        for pattern in _patterns(rule)
    ]
    return _Decider(
        policy.name, policy.priority, tuple(dict.fromkeys(patterns)), policy.mode == "enforce"
    )


def _covered_by(
    patterns: Sequence[str],
    higher: Sequence[int],
    deciders: Sequence[_Decider],
    covers: dict[tuple[int, str], bool],
) -> tuple[tuple[str, int], ...]:
    """The policies that together cover every pattern, or () when one pattern is not covered
    (or there are no patterns: such a rule is in scope for nothing, not shadowed).
    ``higher`` indexes ``deciders`` (sorted highest first); ``covers`` memoizes per agent."""
    by = set()
    for specific in patterns:
        for i in higher:
            known = covers.get((i, specific))
            if known is None:
                known = any(glob_covers(g, specific) for g in deciders[i].patterns)
                covers[(i, specific)] = known
            if known:
                by.add((deciders[i].name, deciders[i].priority))
                break
        else:
            return ()
    return tuple(sorted(by))


@lru_cache(maxsize=4096)
def glob_covers(general: str, specific: str) -> bool:
    """Whether every tool name matched by pattern ``specific`` is matched by ``general``.

    Exact language inclusion over non-empty names (tool names have at least one character,
    so ``?*`` covers ``*``), up to a size limit. The 255-character limit on names and the ban
    on control characters are not used: a coverage that holds only because of them is not
    found (sound, not complete, and never met in practice).

    The check searches the product of the two patterns' automata for a name ``specific``
    matches and ``general`` does not: ``specific`` is followed position by position,
    ``general`` as the set of its positions still alive (subset construction). Characters are
    the literals of both patterns plus one standing for every other character, which both
    patterns treat alike. Pathological patterns (a long run of ``?`` after a ``*`` in
    ``general``) can need exponentially many subsets; past ``_MAX_STATES`` search states the
    answer is False: still sound (never claims a coverage that does not hold), not complete.

    A quick symbol-by-symbol embedding (:func:`_embeds`) answers most cases first; alone it is
    sound but not complete: it misses that ``*?`` covers ``?*``, for example.
    """
    if not is_wildcard(specific):
        return not specific or compile_glob(general)(specific)  # "" matches no tool name
    return _embeds(general, specific) or _has_no_counterexample(general, specific)


def _embeds(general: str, specific: str) -> bool:
    """The quick, sound but incomplete check: each symbol of ``specific`` maps onto ``general``
    in order (a ``*`` only onto a ``*``, a ``?`` onto ``?`` or ``*``, a literal onto itself,
    ``?`` or ``*``). ``fits[j]`` in row ``i``: ``general[i:]`` covers ``specific[j:]`` so."""
    below = [j == len(specific) for j in range(len(specific) + 1)]  # general used up
    for i in range(len(general) - 1, -1, -1):
        symbol = general[i]
        row = [False] * (len(specific) + 1)
        for j in range(len(specific), -1, -1):
            if symbol == "*":  # match nothing more, or absorb specific[j] too
                row[j] = below[j] or (j < len(specific) and row[j + 1])
            elif j < len(specific) and specific[j] != "*" and symbol in ("?", specific[j]):
                row[j] = below[j + 1]
        below = row
    return below[0]


def _has_no_counterexample(general: str, specific: str) -> bool:
    # the literals of both patterns, and None: any character in neither pattern
    alphabet: list[str | None] = [*sorted(set(general + specific) - {"*", "?"}), None]
    start = _closure(general, {0})
    todo = [(i, start, False) for i in _closure(specific, {0})]
    seen = set(todo)
    while todo:
        position, alive, started = todo.pop()
        if started and position == len(specific) and len(general) not in alive:
            return False  # a name specific matches and general does not
        for char in alphabet:
            after = _step(general, alive, char)
            for moved in _step(specific, frozenset({position}), char):
                state = (moved, after, True)
                if state not in seen:
                    if len(seen) >= _MAX_STATES:
                        return False
                    seen.add(state)
                    todo.append(state)
    return True


def _step(pattern: str, positions: frozenset[int], char: str | None) -> frozenset[int]:
    """The positions of ``pattern`` alive after reading ``char`` (None: any other character)."""
    moved = set()
    for position in positions:
        if position == len(pattern):
            continue
        symbol = pattern[position]
        if symbol == "*":
            moved.add(position)
        elif symbol == "?" or symbol == char:
            moved.add(position + 1)
    return _closure(pattern, moved)


def _closure(pattern: str, positions: set[int]) -> frozenset[int]:
    """``positions`` plus every position reached by letting ``*`` match nothing."""
    out = set(positions)
    for position in positions:
        while position < len(pattern) and pattern[position] == "*":
            position += 1
            out.add(position)
    return frozenset(out)
