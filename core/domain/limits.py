"""Rate limits in the domain: a rate_limit rule's fixed window (:class:`RateLimitRef`), what
the engine asks of whoever holds the counters (:class:`Consume`), and the in-memory counters
of the offline runner (:class:`MemoryCounters`). The database's counters are
``core.store.limits``; the engine (``core.domain.engine``) says which limits a grant needs.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROS = 1_000_000


@dataclass(frozen=True, slots=True)
class RateLimitRef:
    """One rate_limit rule: its counter is shared by every tool in the rule's scope."""

    policy_id: str
    policy_name: str
    rule_index: int
    max_calls: int
    window_seconds: int

    @property
    def counter_key(self) -> str:
        return f"rule:{self.policy_id}:{self.rule_index}"

    def window_start(self, now: datetime) -> int:
        """Start (epoch seconds) of the fixed window holding ``now``; windows are aligned to
        multiples of ``window_seconds`` since the Unix epoch."""
        return _epoch_micros(now) // (self.window_seconds * _MICROS) * self.window_seconds

    def retry_after_seconds(self, now: datetime) -> int:
        """Whole seconds until the window holding ``now`` ends, rounded up, at least 1."""
        micros = _epoch_micros(now)
        end = (micros // (self.window_seconds * _MICROS) + 1) * self.window_seconds * _MICROS
        return max(1, -((micros - end) // _MICROS))


def _epoch_micros(now: datetime) -> int:
    """Exact microseconds since the epoch (no float rounding at window boundaries)."""
    delta = now - _EPOCH  # raises TypeError for a naive datetime: fail loudly, not locally
    return (delta.days * 86_400 + delta.seconds) * _MICROS + delta.microseconds


class Consume(Protocol):
    def __call__(self, limits: Sequence[RateLimitRef], now: datetime) -> RateLimitRef | None:
        """Take one call from EVERY limit, all or none. None when taken; otherwise the first
        exhausted limit, and nothing was taken. Only called with a non-empty sequence."""
        ...


class MemoryCounters:
    """An in-memory :class:`Consume` for tests and the offline ``agentauth test`` runner.

    One process only; a lock makes each call all-or-none across threads. Keeps one window per
    counter, so memory stays bounded by the number of rate_limit rules. Like the database's
    counters, a counter never moves back: a call of an earlier window than the stored one is
    counted in the stored window.
    """

    def __init__(self) -> None:
        self._windows: dict[str, tuple[int, int]] = {}  # counter_key -> (window_start, count)
        self._lock = threading.Lock()

    def __call__(self, limits: Sequence[RateLimitRef], now: datetime) -> RateLimitRef | None:
        with self._lock:
            starts = [self._start(limit, now) for limit in limits]
            for limit, start in zip(limits, starts, strict=True):
                if self._count(limit.counter_key, start) >= limit.max_calls:
                    return limit
            for limit, start in zip(limits, starts, strict=True):
                key = limit.counter_key
                self._windows[key] = (start, self._count(key, start) + 1)
        return None

    def used(self, limit: RateLimitRef, now: datetime) -> int:
        """Calls taken from ``limit`` in the window holding ``now``."""
        with self._lock:
            return self._count(limit.counter_key, limit.window_start(now))

    def _start(self, limit: RateLimitRef, now: datetime) -> int:
        """The window a call at ``now`` counts in: its own, or the stored one when later."""
        stored = self._windows.get(limit.counter_key)
        start = limit.window_start(now)
        return start if stored is None else max(start, stored[0])

    def _count(self, key: str, start: int) -> int:
        window = self._windows.get(key)
        return window[1] if window is not None and window[0] == start else 0
