"""Counting the audit log without reading it (decisions §9): the rollup rows each committed
entry adds one to, and how a time range splits into whole hours, whole minutes and the partial
minutes at its edges, so that a count reads a bounded number of rollup rows plus at most two
minutes of entries, however long the log.

Each entry is counted, per minute and per hour of its ``timestamp``, under five keys: by
itself (kind ``*``), by its agent (``a``), by its tool (``t``), by its agent and tool (``b``)
and by its session (``s``, when it has one); every key also holds the entry's ``result`` and
``action``. A filter on any of agent, tool, agent and tool, or session, with any result and
action, is then a sum over the rows of one kind. Pure: the store
(``core.store.auditcounts``) reads and writes the rows; the recorder
(``core.hotpath.chain``) adds a batch's tallies in the transaction that commits it.
"""

from __future__ import annotations

from collections import Counter
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
ALL, AGENT, TOOL, AGENT_TOOL, SESSION = "*", "a", "t", "b", "s"
KIND_OF_DIMENSIONS: dict[frozenset[str], str] = {
    frozenset(): ALL,
    frozenset({"agent"}): AGENT,
    frozenset({"tool"}): TOOL,
    frozenset({"agent", "tool"}): AGENT_TOOL,
    frozenset({"session"}): SESSION,
}

#: a rollup row's key: (grain, kind, agent_id, tool_name, session_id, bucket, result, action),
#: with "" in the dimensions its kind does not key (no entry's agent, tool or session is "")
Key = tuple[int, str, str, str, str, int, str, str]


def epoch_seconds(moment: datetime) -> int:
    """Whole seconds since the epoch, rounded down."""
    return (moment - EPOCH) // timedelta(seconds=1)


def keys_of(
    *,
    agent_id: str,
    tool_name: str,
    session_id: str | None,
    result: str,
    action: str,
    timestamp: datetime,
) -> list[Key]:
    """The rollup rows one entry counts in."""
    second = epoch_seconds(timestamp)
    found: list[Key] = []
    for grain in GRAINS:
        bucket = second - second % grain
        found += [
            (grain, ALL, "", "", "", bucket, result, action),
            (grain, AGENT, agent_id, "", "", bucket, result, action),
            (grain, TOOL, "", tool_name, "", bucket, result, action),
            (grain, AGENT_TOOL, agent_id, tool_name, "", bucket, result, action),
        ]
        if session_id is not None:
            found.append((grain, SESSION, "", "", session_id, bucket, result, action))
    return found


class Tally:
    """What a batch adds to the rollups, by key; :meth:`mark` and :meth:`back_to` follow the
    batch's savepoints."""

    def __init__(self) -> None:
        self.counts: Counter[Key] = Counter()

    def add(self, keys: list[Key], amount: int = 1) -> None:
        for key in keys:
            self.counts[key] += amount

    def mark(self) -> Counter[Key]:
        return Counter(self.counts)

    def back_to(self, mark: Counter[Key]) -> None:
        self.counts = Counter(mark)

    def items(self) -> list[tuple[Key, int]]:
        """The non-zero changes, in key order (so two batches lock rows in one order)."""
        return sorted((key, amount) for key, amount in self.counts.items() if amount)


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
    order, none empty."""
    if start is not None and end is not None and start >= end:
        return []
    if not grains:
        return [Piece(None, start, end)]
    grain, finer = grains[0], grains[1:]
    low = None if start is None else ceil_to(start, grain)
    high = None if end is None else floor_to(end, grain)
    if low is not None and high is not None and low >= high:
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
