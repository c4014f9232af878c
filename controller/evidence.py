"""The evidence beside a mode change (decisions §10): for each policy a plan moves between
``enforce``, ``warn`` and ``shadow``, what it would have done on live traffic so far, its
shadow report over the last 7 days read from the database (``core.store.shadow``), so that the
pull request that promotes a policy carries what it is promoted on. Called by ``plan`` (which
has a database) and ``diff`` (when given ``--db``); rendered by ``controller.render``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from controller.plan import ABSENT, Action, Plan
from core.domain.errors import PolicyNotFound
from core.store import shadow
from core.store.shadow import Report

#: how far back the evidence looks
DAYS = shadow.DEFAULT_DAYS


@dataclass(frozen=True)
class Evidence:
    """A policy whose mode the plan changes: its name, agent and id, the mode before and after,
    whether a database was read, and its report (None when none was read, or the database
    does not hold the policy)."""

    policy: str
    agent: str | None
    policy_id: str
    before: str
    after: str
    looked: bool = False
    report: Report | None = None


def mode_changes(plan: Plan) -> list[Evidence]:
    """The plan's policies whose mode changes (updates only: a new policy has no past), without
    their reports."""
    return list(_mode_changes(plan))


def _mode_changes(plan: Plan) -> Iterator[Evidence]:
    for change in plan.changes:
        if change.kind != "Policy" or change.action is not Action.UPDATE:
            continue
        for field in change.fields:
            if field.path == ("mode",):
                yield Evidence(
                    change.name, change.agent, change.id, _mode(field.before), _mode(field.after)
                )


def _mode(value: object) -> str:
    """A mode as planned: a policy stored before modes existed holds none, and is enforced."""
    return "enforce" if value is ABSENT or value is None else str(value)


def gather(session: Session, workspace_id: str, plan: Plan, now: datetime) -> list[Evidence]:
    """:func:`mode_changes` with the report of each policy over the :data:`DAYS` before
    ``now``, read in ``session`` (None for a policy the database does not hold)."""
    found = []
    for evidence in mode_changes(plan):
        report: Report | None
        try:
            report = shadow.report(
                session, workspace_id, evidence.policy_id, now - timedelta(days=DAYS), now
            )
        except PolicyNotFound:
            report = None
        found.append(
            Evidence(
                evidence.policy,
                evidence.agent,
                evidence.policy_id,
                evidence.before,
                evidence.after,
                True,
                report,
            )
        )
    return found
