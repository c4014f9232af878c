"""build_plan on plain values (no database): the changes a reviewer reads are the changes apply
makes, including the ones that follow from an id pinned in a file or an adoption."""

from __future__ import annotations

import textwrap

import pytest

from controller.load import SourceFile
from controller.plan import Action, Change, LiveObject, LiveState, Plan, build_plan
from controller.repo import Repo, load_repo
from controller.state import as_applied

PINNED = "0b0b0b0b-1111-4222-8333-444455556666"
WORKSPACE = "plan-tests"


def _repo(agent_metadata: str = "name: finance-agent") -> Repo:
    text = f"""
        apiVersion: agentauth/v1
        kind: Agent
        metadata: {{{agent_metadata}}}
        spec: {{description: pays refunds}}
        ---
        apiVersion: agentauth/v1
        kind: Policy
        metadata: {{name: refunds}}
        spec:
          agent: finance-agent
          rules: [{{type: tool_allowlist, tools: [payments.refund]}}]
        ---
        apiVersion: agentauth/v1
        kind: Policy
        metadata: {{name: no-shell}}
        spec:
          agent: finance-agent
          priority: 100
          rules: [{{type: tool_denylist, tools: ["shell.*"]}}]
        """
    repo = load_repo([SourceFile("all.yaml", textwrap.dedent(text).encode())], WORKSPACE)
    assert not repo.errors, repo.errors
    return repo


def _pinned() -> Repo:
    return _repo(f"name: finance-agent, id: {PINNED}")


def _moves(plan: Plan) -> dict[str, tuple[object, object]]:
    """Each updated policy's agent_id change (before, after)."""
    out = {}
    for change in plan.of(Action.UPDATE):
        for field in change.fields:
            if field.path == ("agent_id",):
                out[change.name] = (field.before, field.after)
    return out


@pytest.mark.parametrize("prune", [False, True], ids=["kept", "pruned"])
def test_pinning_an_id_on_an_applied_agent_moves_its_policies_in_the_plan(prune):
    base, head = _repo(), _pinned()
    old_id = base.agents["finance-agent"].id
    plan = build_plan(head, as_applied(base), prune_agents=prune)
    retired = Action.DELETE if prune else Action.ORPHAN
    assert [(c.action, c.kind, c.name, c.id) for c in plan.changes] == [
        (Action.CREATE, "Agent", "finance-agent", PINNED),
        (Action.UPDATE, "Policy", "no-shell", head.policies["no-shell"].id),
        (Action.UPDATE, "Policy", "refunds", head.policies["refunds"].id),
        (retired, "Agent", "finance-agent", old_id),
    ]
    assert _moves(plan) == {"no-shell": (old_id, PINNED), "refunds": (old_id, PINNED)}
    assert all(len(c.fields) == 1 for c in plan.of(Action.UPDATE))  # nothing else changes
    assert not any(c.drift for c in plan.changes)
    assert PINNED in (plan.changes[-1].note or "")  # the old agent says where they went


def _live_before_agent_ids_were_recorded(repo: Repo) -> LiveState:
    """A database written by a controller whose managed_spec had no policy ``agent_id``."""
    state = as_applied(repo)
    policies = [
        LiveObject(p.kind, p.id, p.name, p.fields, True,
                   {k: v for k, v in p.fields.items() if k != "agent_id"})
        for p in state.policies
    ]  # fmt: skip
    return LiveState(state.agents, tuple(policies), state.inventory)


def test_a_managed_spec_without_agent_id_shows_no_change_and_no_drift():
    base = _repo()
    live = _live_before_agent_ids_were_recorded(base)
    assert build_plan(base, live).changes == ()
    moved = build_plan(_pinned(), live)
    assert set(_moves(moved)) == {"refunds", "no-shell"}
    assert not any(c.drift for c in moved.changes)


def _unmanaged(repo: Repo) -> LiveState:
    """The repository's agent made through the API with the id the repository gives it."""
    agent = repo.agents["finance-agent"]
    fields = {"name": agent.name, "description": None, "status": "active"}
    return LiveState((LiveObject("Agent", agent.id, agent.name, fields, False),))


@pytest.mark.parametrize(
    ("adopt", "expected"),
    [(False, Action.CONFLICT), (True, Action.UPDATE)],
    ids=["refused", "adopted"],
)
def test_an_adoptable_conflict_is_planned_as_an_update_with_adopt(adopt, expected):
    repo = _repo()
    plan = build_plan(repo, _unmanaged(repo), adopt=adopt)
    agent: Change = plan.changes[0]
    assert (agent.action, agent.kind, agent.name) == (expected, "Agent", "finance-agent")
    assert plan.summary()["conflict"] == (0 if adopt else 1)
    if adopt:
        assert [(f.where, f.before, f.after) for f in agent.fields] == [
            ("description", None, "pays refunds")
        ]
        assert not agent.drift  # taking an object over is not a repair
        assert "adopt" in (agent.note or "")


def test_a_clash_by_name_is_a_conflict_even_with_adopt():
    repo = _repo()
    state = _unmanaged(_repo(f"name: finance-agent, id: {PINNED}"))
    plan = build_plan(repo, state, adopt=True)
    assert plan.changes[0].action is Action.CONFLICT
    assert f"set metadata.id: {PINNED}" in (plan.changes[0].note or "")
