"""The clock the service reads, passed in wherever "now" matters so tests can fix it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


def isoformat(moment: datetime) -> str:
    """``2026-11-21T15:13:00.123456Z``: UTC, microseconds, a ``Z`` suffix; the year always in
    four digits (``0738-...``: the C library's ``%Y`` writes ``738``, which is no RFC 3339
    date-time)."""
    utc = moment.astimezone(UTC)
    text = utc.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return text if utc.year >= 1000 else f"{utc.year:04d}{text[text.index('-') :]}"


def parse_instant(text: str) -> datetime:
    """An ISO 8601 date-time (RFC 3339's ``t`` and ``z`` in either case); without an offset it
    is UTC. One that falls before year 1 or after year 9999 once in UTC (such as
    ``0001-01-01T00:00:00+01:00``) is the first or the last instant a datetime holds. Raises
    ValueError."""
    if not isinstance(text, str) or not 10 <= len(text) <= 64:
        raise ValueError("not an ISO 8601 date-time")
    moment = datetime.fromisoformat(text.upper())
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    try:
        return moment.astimezone(UTC)
    except OverflowError:
        edge = datetime.min if moment.year == 1 else datetime.max
        return edge.replace(tzinfo=UTC)
