"""An agent's rate limits and budgets and what their current windows hold (decisions §8), its
policies on trial's too, each with its policy's mode (their counters are their own: §10):
``GET /v1/agents/:id/usage`` and the dashboard's bars. Read from the same compiled policies
(:func:`core.hotpath.decisions.load_policies`) and counters the decisions use, so what it says
is left is what the next call can take.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from core.domain.clock import isoformat
from core.domain.limits import SCALE, LimitRef
from core.hotpath.decisions import load_policies
from core.store import agents, limits


def usage(
    session: Session, workspace_id: str, agent_id: str, now: datetime, session_id: str | None
) -> list[dict[str, Any]]:
    """One item per rate_limit and budget rule of the agent's enabled policies, in evaluation
    order. A per-session rule reports ``session_id``'s counter, and null counts without one.
    NotFound when the workspace has no such agent."""
    agents.get_agent(session, workspace_id, agent_id)
    found = []
    for policy in load_policies(session.connection(), workspace_id, agent_id):
        for rule in policy.rules:
            if rule.limit is not None:
                found.append(_item(session, rule.limit, now, session_id, policy.mode))
    return found


def _item(
    session: Session, limit: LimitRef, now: datetime, session_id: str | None, mode: str
) -> dict[str, Any]:
    start = limit.window_start(now)
    used: int | None
    if limit.per == "session":
        used = (
            None
            if session_id is None
            else limits.used(session, limit.session_key(session_id), start)
        )
    else:
        used = limits.used(session, limit.counter_key, start)
    return {
        "policyId": limit.policy_id,
        "mode": mode,
        "ruleIndex": limit.rule_index,
        "type": limit.kind,
        "per": limit.per,
        "parameter": limit.parameter,
        "windowStart": isoformat(datetime.fromtimestamp(start, UTC)),
        "windowSeconds": limit.window_seconds,
        "used": _number(limit, used),
        "limit": _number(limit, limit.maximum),
        "remaining": _number(limit, None if used is None else max(0, limit.maximum - used)),
    }


def _number(limit: LimitRef, amount: int | None) -> int | float | None:
    """Calls as an integer; a budget's units as the number they stand for (the nearest JSON
    number: 0.3 for 300000 units)."""
    if amount is None or limit.parameter is None:
        return amount
    whole, part = divmod(amount, SCALE)
    return whole if part == 0 else amount / SCALE
