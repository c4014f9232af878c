"""Counting the audit log without reading it (decisions §9): the rollup rows each committed
entry adds one to, and how a time range splits into whole hours, whole minutes and the partial
minutes at its edges, so that a count reads a bounded number of rollup rows plus at most two
minutes of entries, however long the log.

Each entry is counted per hour of its ``timestamp`` under five keys: by itself (kind ``*``),
by its agent (``a``), by its tool (``t``), by its agent and tool (``b``) and by its session
(``s``, when it has one); every key also holds the entry's ``result`` and ``action``. A filter
on any of agent, tool, agent and tool, or session, with any result and action, is then a sum
over the rows of one kind. The first three are counted per minute too (:data:`GRAINS_OF`):
an agent and tool or a session has so few entries a minute that a row each would be about a
row an entry, so their partial hours are counted from the entries, through the agent's or the
session's index.

An entry with a would-be decision (decisions §10) is counted under a sixth key too, for the
shadow report: by its agent and tool, the policy that made its would-be decision and that
decision's result (kind ``w``; the row's ``session_id`` holds the policy, "" for none, and its
``action`` the would-be result), per hour and per minute.

The batch that commits entries writes, in its transaction, one tally per workspace: how many
of its entries share each :data:`Signature` (a few tuples, one insert: the hot path's whole
share of the counting). Folding a tally into the rollup rows, each signature into its eight
keys, happens later and off the hot path; until then readers add the tallies not yet folded,
so a count is exact at every moment. Pure: ``core.store.auditcounts`` reads, writes and folds
the rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

MINUTE = 60
HOUR = 3600
DAY = 86400
#: the grains kept: every range is cut into these (coarsest first) and raw minutes' parts
GRAINS = (HOUR, MINUTE)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = timedelta(microseconds=1)

#: the kinds of row, by the filter dimensions they answer for
ALL, AGENT, TOOL, AGENT_TOOL, SESSION, WOULD_BE = "*", "a", "t", "b", "s", "w"
KIND_OF_DIMENSIONS: dict[frozenset[str], str] = {
    frozenset(): ALL,
    frozenset({"agent"}): AGENT,
    frozenset({"tool"}): TOOL,
    frozenset({"agent", "tool"}): AGENT_TOOL,
    frozenset({"session"}): SESSION,
}
KINDS = (ALL, AGENT, TOOL, AGENT_TOOL, SESSION, WOULD_BE)
#: the grains each kind is counted in (coarsest first)
GRAINS_OF = {
    ALL: GRAINS,
    AGENT: GRAINS,
    TOOL: GRAINS,
    AGENT_TOOL: (HOUR,),
    SESSION: (HOUR,),
    WOULD_BE: GRAINS,
}

#: a rollup row's key: (grain, kind, agent_id, tool_name, session_id, bucket, result, action),
#: with "" in the dimensions its kind does not key (no entry's agent, tool or session is "")
Key = tuple[int, str, str, str, str, int, str, str]


def epoch_seconds(moment: datetime) -> int:
    """Whole seconds since the epoch, rounded down."""
    return (moment - EPOCH) // timedelta(seconds=1)


#: what a committed entry says of itself for counting: (agent_id, tool_name, session_id or
#: None, result, action, the start of its minute in seconds since the epoch, the policy that
#: made its would-be decision ("" for none), and that decision's result (None: no would-be
#: decision))
Signature = tuple[str, str, str | None, str, str, int, str, str | None]


def signature_of(
    *,
    agent_id: str,
    tool_name: str,
    session_id: str | None,
    result: str,
    action: str,
    timestamp: datetime,
    would_policy_id: str | None = None,
    would_result: str | None = None,
) -> Signature:
    second = int(timestamp.timestamp())  # whole seconds: microseconds never round it up here
    minute = second - second % MINUTE
    return (
        agent_id,
        tool_name,
        session_id,
        result,
        action,
        minute,
        would_policy_id or "",
        would_result,
    )


def keys_of(signature: Signature) -> list[Key]:
    """The rollup rows an entry of ``signature`` counts in."""
    agent_id, tool_name, session_id, result, action, minute, would_policy, would = signature
    found: list[Key] = []
    for grain in GRAINS:
        bucket = minute - minute % grain
        found += [
            (grain, ALL, "", "", "", bucket, result, action),
            (grain, AGENT, agent_id, "", "", bucket, result, action),
            (grain, TOOL, "", tool_name, "", bucket, result, action),
        ]
        if grain in GRAINS_OF[AGENT_TOOL]:
            found.append((grain, AGENT_TOOL, agent_id, tool_name, "", bucket, result, action))
        if session_id is not None and grain in GRAINS_OF[SESSION]:
            found.append((grain, SESSION, "", "", session_id, bucket, result, action))
        if would is not None:
            found.append(
                (grain, WOULD_BE, agent_id, tool_name, would_policy, bucket, result, would)
            )
    return found


@dataclass(frozen=True)
class Piece:
    """A part of a range: whole buckets of ``grain`` seconds from ``start`` (inclusive) to
    ``end`` (exclusive), or with ``grain`` None the entries themselves (less than a minute's
    worth, at an edge). A bound of None is the log's beginning or end."""

    grain: int | None
    start: datetime | None
    end: datetime | None


def floor_to(moment: datetime, grain: int) -> datetime:
    second = epoch_seconds(moment)
    return EPOCH + timedelta(seconds=second - second % grain)


def ceil_to(moment: datetime, grain: int) -> datetime:
    floor = floor_to(moment, grain)
    return floor if floor == moment else floor + timedelta(seconds=grain)


def pieces(start: datetime | None, end: datetime | None, grains: tuple[int, ...]) -> list[Piece]:
    """``[start, end)`` as whole buckets of the coarsest of ``grains`` that fit, the rest at
    its edges in finer grains, and what is left of a minute as raw entries; the pieces in time
    order, none empty, none straddling a boundary of any of ``grains`` (so each piece lies in
    one bucket of every grain coarser than its own)."""
    if start is not None and end is not None and start >= end:
        return []
    if not grains:
        return [Piece(None, start, end)]
    grain, finer = grains[0], grains[1:]
    low = None if start is None else ceil_to(start, grain)
    high = None if end is None else floor_to(end, grain)
    if low is not None and high is not None and low >= high:
        if low == high and start is not None and end is not None and start < low < end:
            # no whole bucket, but a boundary inside: no piece may straddle it
            return pieces(start, low, finer) + pieces(low, end, finer)
        return pieces(start, end, finer)
    found: list[Piece] = []
    if start is not None and low is not None and start < low:
        found += pieces(start, low, finer)
    found.append(Piece(grain, low, high))
    if end is not None and high is not None and high < end:
        found += pieces(high, end, finer)
    return found


def inclusive_end(until: datetime | None) -> datetime | None:
    """The exclusive end of a range whose last instant is ``until``."""
    return None if until is None else until + _MICRO


def bucket_start(second: int, grain: int) -> int:
    """The start of the ``grain``-second bucket (aligned in UTC) holding ``second``."""
    return second - second % grain
