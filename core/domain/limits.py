"""Limits in the domain: a ``rate_limit`` or ``budget`` rule's fixed window (:class:`LimitRef`),
what one call takes from it (:class:`Charge`), what the engine asks of whoever holds the
counters (:class:`Consume`), and the in-memory counters of the offline runner
(:class:`MemoryCounters`). The database's counters are ``core.store.limits``; the engine
(``core.domain.engine``) says which limits a grant needs. Semantics: decisions §2 and §8.

A budget sums a parameter exactly: its amounts and ``max`` are counted in integer units of one
millionth (:data:`SCALE`), read from the number's decimal text, so 0.1 + 0.2 is exactly 0.3. An
amount with more than six decimals is charged rounded up and a ``max`` is rounded down: never
less spent, never more allowed, than exact arithmetic says.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Protocol

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROS = 1_000_000
#: a budget's units per 1 of its parameter
SCALE = 1_000_000
#: the largest budget ``max`` (the schema's bound): its units fit a 64-bit counter
MAX_BUDGET = 10**12


@dataclass(frozen=True, slots=True)
class LimitRef:
    """One ``rate_limit`` or ``budget`` rule: one counter per window, shared by every tool in
    the rule's scope (one per session with ``per: session``). ``maximum`` is what the counter
    may hold: the rule's ``maxCalls``, or its budget ``max`` in units."""

    policy_id: str
    policy_name: str
    rule_index: int
    maximum: int
    window_seconds: int
    kind: str = "rate_limit"
    per: str = "agent"
    #: a budget's parameter, whose value each call spends
    parameter: str | None = None

    @property
    def counter_key(self) -> str:
        return f"rule:{self.policy_id}:{self.rule_index}"

    def session_key(self, session_id: str) -> str:
        """The counter of one session (a digest: session ids are up to 255 characters)."""
        digest = hashlib.sha256(session_id.encode()).hexdigest()[:32]
        return f"{self.counter_key}:session:{digest}"

    def charge(self, parameters: Mapping[str, Any], session_id: str | None) -> Charge | str:
        """What a call takes from this limit, or why the call cannot be counted (a per-session
        limit without a session; a budget's parameter missing, not a finite number or
        negative): the rule's policy denies it."""
        if self.per == "session":
            if session_id is None:
                return "session required"
            key = self.session_key(session_id)
        else:
            key = self.counter_key
        if self.parameter is None:
            return Charge(self, key, 1)
        value = parameters.get(self.parameter)
        if value is None and self.parameter not in parameters:
            return f"parameter '{self.parameter}' is required by the budget"
        amount = units(value)
        if amount is None:
            return f"parameter '{self.parameter}' must be a number of 0 or more for the budget"
        return Charge(self, key, amount)

    def window_start(self, now: datetime) -> int:
        """Start (epoch seconds) of the fixed window holding ``now``; windows are aligned to
        multiples of ``window_seconds`` since the Unix epoch."""
        return _epoch_micros(now) // (self.window_seconds * _MICROS) * self.window_seconds

    def retry_after_seconds(self, now: datetime) -> int:
        """Whole seconds until the window holding ``now`` ends, rounded up, at least 1."""
        micros = _epoch_micros(now)
        end = (micros // (self.window_seconds * _MICROS) + 1) * self.window_seconds * _MICROS
        return max(1, -((micros - end) // _MICROS))

    def shown(self, amount: int) -> str:
        """A counter's amount as the rule states it: calls, or the budget's units as a number."""
        return str(amount) if self.parameter is None else units_text(amount)


@dataclass(frozen=True, slots=True)
class Charge:
    """What one call takes from one limit: ``amount`` (1 for a rate limit, the parameter's
    units for a budget) from the counter ``key``."""

    limit: LimitRef
    key: str
    amount: int

    @property
    def fits_alone(self) -> bool:
        """Whether an empty window could take it (a budget amount over ``max`` never fits)."""
        return self.amount <= self.limit.maximum


def units(value: Any) -> int | None:
    """A budget amount in units (rounded up past six decimals), or None for anything but a
    finite number of 0 or more (booleans are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value < 0:
        return None
    # the float's shortest decimal text is the number the JSON said (0.1 is 0.1, not 0.1000..)
    exact = Decimal(value) if isinstance(value, int) else Decimal(repr(value))
    return math.ceil(exact * SCALE)


def max_units(value: int | float) -> int:
    """A budget's ``max`` in units, rounded down."""
    exact = Decimal(value) if isinstance(value, int) else Decimal(repr(value))
    return math.floor(exact * SCALE)


def units_text(amount: int) -> str:
    """Units as the number they stand for: 300000 is ``0.3``, 5000000 is ``5``."""
    text = format(Decimal(amount) / SCALE, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def _epoch_micros(now: datetime) -> int:
    """Exact microseconds since the epoch (no float rounding at window boundaries)."""
    delta = now - _EPOCH  # raises TypeError for a naive datetime: fail loudly, not locally
    return (delta.days * 86_400 + delta.seconds) * _MICROS + delta.microseconds


@dataclass(frozen=True, slots=True)
class Refusal:
    """The charge a window could not take, what that window holds, and where it starts: the
    call's own window, or a later one another call opened first (a counter never moves back,
    so the call waits for that one's end)."""

    charge: Charge
    used: int
    window_start: int

    def retry_after_seconds(self, now: datetime) -> int:
        """Whole seconds from ``now`` until the refusing window ends, rounded up, at least 1."""
        end = (self.window_start + self.charge.limit.window_seconds) * _MICROS
        return max(1, -((_epoch_micros(now) - end) // _MICROS))


class Consume(Protocol):
    def __call__(self, charges: Sequence[Charge], now: datetime) -> Refusal | None:
        """Take EVERY charge, all or none. None when taken; otherwise the first charge its
        window cannot take, and nothing was taken. Only called with a non-empty sequence."""
        ...


class MemoryCounters:
    """An in-memory :class:`Consume` for tests and the offline ``agentauth test`` runner.

    One process only; a lock makes each call all-or-none across threads. Keeps one window per
    counter. Like the database's counters, a counter never moves back: a call of an earlier
    window than the stored one is counted in the stored window.
    """

    def __init__(self) -> None:
        self._windows: dict[str, tuple[int, int]] = {}  # counter key -> (window_start, sum)
        self._lock = threading.Lock()

    def __call__(self, charges: Sequence[Charge], now: datetime) -> Refusal | None:
        with self._lock:
            starts = [self._start(charge, now) for charge in charges]
            for charge, start in zip(charges, starts, strict=True):
                used = self._count(charge.key, start)
                if not charge.fits_alone or used + charge.amount > charge.limit.maximum:
                    return Refusal(charge, used, start)
            for charge, start in zip(charges, starts, strict=True):
                self._windows[charge.key] = (start, self._count(charge.key, start) + charge.amount)
        return None

    def used(self, limit: LimitRef, now: datetime, session_id: str | None = None) -> int:
        """What ``limit`` holds in the window holding ``now`` (the session's, when given)."""
        key = limit.counter_key if session_id is None else limit.session_key(session_id)
        with self._lock:
            return self._count(key, limit.window_start(now))

    def _start(self, charge: Charge, now: datetime) -> int:
        """The window a call at ``now`` counts in: its own, or the stored one when later."""
        stored = self._windows.get(charge.key)
        start = charge.limit.window_start(now)
        return start if stored is None else max(start, stored[0])

    def _count(self, key: str, start: int) -> int:
        window = self._windows.get(key)
        return window[1] if window is not None and window[0] == start else 0
