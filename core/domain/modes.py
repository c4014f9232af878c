"""Shadow and warn modes (decisions §10): the would-be decision beside the real one.

Only ``enforce`` policies decide a call. When an agent has an enabled ``warn`` or ``shadow``
policy, its call is evaluated a second time by :func:`core.domain.engine.evaluate` over every
enabled policy, as if all were enforced (:class:`PolicySet`), and settled here
(:meth:`Trial.settle`): the limits of ``warn``/``shadow`` policies are taken from counters of
their own (their rules' counters, which no enforced decision touches); the limits of
``enforce`` policies are read as they stood before the call (:func:`peek`) and never taken; a
``require_approval`` rule that escalates creates no approval. Pure, like the engine: the
caller passes what the counters hold and how to take the trial policies' charges.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from core.domain.engine import (
    CompiledPolicy,
    Decision,
    Evaluated,
    NeedsApproval,
    PendingGrant,
    limited,
)
from core.domain.limits import Charge, Consume, Refusal


class Mode(StrEnum):
    ENFORCE = "enforce"
    WARN = "warn"
    SHADOW = "shadow"


#: the would-be results (an entry's ``wouldBe.result``)
ALLOWED, DENIED, ESCALATED, ERROR = "allowed", "denied", "escalated", "error"
#: the reason of a would-be decision that could not be computed
ERROR_REASON = "the would-be decision could not be computed"


@dataclass(frozen=True, slots=True)
class WouldBe:
    """The would-be decision: its result (``allowed``, ``denied``, ``escalated`` or
    ``error``), the policy and rule that made it (None for the default deny, an agent's
    status and an error), its reason, and whether a ``warn`` policy made it."""

    result: str
    policy_id: str | None
    rule_index: int | None
    reason: str
    warn: bool = False

    @classmethod
    def of(cls, decision: Decision, warn_ids: frozenset[str] = frozenset()) -> WouldBe:
        policy_id = decision.policy_id
        warn = policy_id is not None and policy_id in warn_ids
        return cls(decision.outcome, policy_id, decision.rule_index, decision.reason, warn)

    def as_json(self) -> dict[str, Any]:
        """As the audit entry carries it (``wouldBe``), and its hash covers it."""
        return {
            "result": self.result,
            "policyId": self.policy_id,
            "ruleIndex": self.rule_index,
            "reason": self.reason,
        }

    def warning(self, real: Decision) -> dict[str, Any] | None:
        """The decision response's warning: when a ``warn`` policy made this would-be
        decision and its result differs from the real one's."""
        if not self.warn or self.result == real.outcome:
            return None
        return {"policyId": self.policy_id, "result": self.result, "reason": self.reason}


#: a would-be decision that failed: the real decision stands
FAILED = WouldBe(ERROR, None, None, ERROR_REASON)


@dataclass(frozen=True, slots=True)
class PolicySet:
    """An agent's enabled policies as the two decisions see them: ``enforced`` decide the
    call; ``every`` (all modes, in the same order), when some are ``warn`` or ``shadow``,
    decide the would-be decision (None: the agent has none, and no would-be decision is
    made). ``warn_ids`` and ``trial_ids`` name the ``warn`` and the ``warn``/``shadow``
    policies."""

    enforced: Sequence[CompiledPolicy]
    every: Sequence[CompiledPolicy] | None = None
    warn_ids: frozenset[str] = frozenset()
    trial_ids: frozenset[str] = frozenset()

    @classmethod
    def of(cls, ordered: Iterable[CompiledPolicy]) -> PolicySet:
        """From enabled policies in evaluation order (``order_policies``)."""
        every = list(ordered)
        enforced = [policy for policy in every if policy.mode == Mode.ENFORCE]
        if len(enforced) == len(every):
            return cls(enforced)
        warn = frozenset(policy.id for policy in every if policy.mode == Mode.WARN)
        trial = frozenset(policy.id for policy in every if policy.mode != Mode.ENFORCE)
        return cls(enforced, every, warn, trial)


#: ``peek(charges, now)``: the first of ``charges`` that its counter, as it stands, could not
#: take (None when each could); nothing is taken
Peek = Callable[[Sequence[Charge], datetime], Refusal | None]


@dataclass(frozen=True, slots=True)
class Trial:
    """The would-be decision, evaluated (off any lock), to be settled beside the real one."""

    evaluated: Evaluated
    warn_ids: frozenset[str]
    trial_ids: frozenset[str]

    @property
    def enforced_charges(self) -> tuple[Charge, ...]:
        """The charges of ``enforce`` policies the would-be grant needs: read (with
        :func:`peek`) before the real decision takes its own."""
        if not isinstance(self.evaluated, PendingGrant):
            return ()
        return tuple(c for c in self.evaluated.limits if c.limit.policy_id not in self.trial_ids)

    @property
    def decided(self) -> WouldBe | None:
        """The would-be decision when it needs no counter and no approval (None otherwise)."""
        if isinstance(self.evaluated, Decision):
            return WouldBe.of(self.evaluated, self.warn_ids)
        return None

    def settle(self, real: Decision, refused: Refusal | None, consume: Consume) -> WouldBe:
        """The would-be decision, given the real one and ``refused``: what :func:`peek` said
        of :attr:`enforced_charges` before the real decision was settled. Only the charges of
        ``warn``/``shadow`` policies are taken, through ``consume``, and only when the
        would-be decision grants."""
        evaluated = self.evaluated
        if isinstance(evaluated, Decision):
            return WouldBe.of(evaluated, self.warn_ids)
        if isinstance(evaluated, PendingGrant):
            if refused is None:
                own = [c for c in evaluated.limits if c.limit.policy_id in self.trial_ids]
                refused = consume(own, evaluated.now) if own else None
            if refused is not None:
                return WouldBe.of(limited(refused, evaluated.now), self.warn_ids)
            return WouldBe.of(evaluated.granted, self.warn_ids)
        return self._escalation(evaluated, real)

    def _escalation(self, needs: NeedsApproval, real: Decision) -> WouldBe:
        """A require_approval rule asks for a person. When an enforced policy's rule does and
        the real decision came from that same rule, the would-be decision is the real one (its
        approval was looked up, used or asked for there); otherwise it is ``escalated``, and
        no approval is created."""
        if (
            needs.policy_id not in self.trial_ids
            and real.policy_id == needs.policy_id
            and real.rule_index == needs.rule_index
        ):
            return WouldBe.of(real, self.warn_ids)
        rule = f"policy '{needs.policy_name}' rule {needs.rule_index} (require_approval)"
        reason = f"approval required by {rule}: {needs.problem}"
        warn = needs.policy_id in self.warn_ids
        return WouldBe(ESCALATED, needs.policy_id, needs.rule_index, reason, warn)


def peek(
    charges: Sequence[Charge], now: datetime, stored: Callable[[str], tuple[int, int] | None]
) -> Refusal | None:
    """The first of ``charges`` that its counter could not take as it stands, None when each
    could; ``stored(key)`` is ``(window_start, held)`` of a counter (None: never used). The
    windows work as the counters' own: a call counts in its window, or in a later one the
    counter holds already."""
    for charge in charges:
        start = charge.limit.window_start(now)
        found = stored(charge.key)
        used = 0
        if found is not None and found[0] >= start:
            start, used = found
        if not charge.fits_alone or used + charge.amount > charge.limit.maximum:
            return Refusal(charge, used, start)
    return None
