"""The clock the service reads, passed in wherever "now" matters so tests can fix it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


def isoformat(moment: datetime) -> str:
    """``2026-11-21T15:13:00.123456Z``: UTC, microseconds, a ``Z`` suffix."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_instant(text: str) -> datetime:
    """An ISO 8601 date-time; without an offset it is UTC. Raises ValueError."""
    if not isinstance(text, str) or not 10 <= len(text) <= 64:
        raise ValueError("not an ISO 8601 date-time")
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)
