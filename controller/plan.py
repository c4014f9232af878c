"""Plan: desired state (a repository) against live state -> a closed set of changes.

Over 300 lines as one unit: the plan's types and the one algorithm that builds them (matching,
conflicts, retiring, field diffs) change together, for the same reason.

Pure: :func:`build_plan` takes plain values and returns a :class:`Plan`; reading the database
(``controller.state``) and writing it (``controller.apply``) happen elsewhere. Like Terraform,
each change is an action on one object with field-level before/after: a change to a rule list
says which rule and which member (``rules[2].parameters.amount.max``).

Every managed object carries what the controller last wrote to it (``managed_spec``). A field
whose live value differs from that was changed outside the repository, through the API: the
change that puts it back is marked as drift. Objects the repository declares that exist
unmanaged (same id, or same name) are conflicts: apply refuses them. Planned with ``adopt``, an
unmanaged object with the same id is an update that takes it over instead. An id that belongs to
an object of another workspace (ids are unique across workspaces) is a conflict nothing adopts:
the plan says which file declares it and shows nothing of the other workspace's object.

A policy's agent is a field like any other (``agent_id``): a policy whose agent gets another id
(``metadata.id`` pinned or changed, an agent renamed) is an update that moves it, planned and
shown before the old agent is kept or pruned.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from controller.repo import DesiredAgent, DesiredPolicy, Repo
from core.domain import jsonvalues
from schemas import format_path


class Action(StrEnum):
    CREATE = "create"
    UPDATE = "update"
    DELETE = "delete"
    ORPHAN = "orphan"  # a managed agent gone from the repository, kept without --prune-agents
    CONFLICT = "conflict"  # declared, and present but not managed by the repository


class _Absent:
    def __repr__(self) -> str:
        return "ABSENT"


#: a member missing on one side of a change (a rule added or removed, a field not set)
ABSENT: Any = _Absent()


@dataclass(frozen=True)
class FieldChange:
    path: tuple[str | int, ...]
    before: Any
    after: Any
    drift: bool = False  # the live value is not what the controller last wrote

    @property
    def where(self) -> str:
        return format_path(self.path)


@dataclass(frozen=True)
class Change:
    action: Action
    kind: str  # Agent | Policy
    name: str
    id: str
    agent: str | None = None  # a policy's agent (name)
    before: Mapping[str, Any] | None = None  # the live fields
    after: Mapping[str, Any] | None = None  # the desired fields
    fields: tuple[FieldChange, ...] = ()
    source: str | None = None  # file:line of the declaring document
    note: str | None = None

    @property
    def drift(self) -> bool:
        return any(f.drift for f in self.fields) or (self.note or "").startswith("drift")


@dataclass(frozen=True)
class Plan:
    changes: tuple[Change, ...]

    def of(self, *actions: Action) -> list[Change]:
        return [c for c in self.changes if c.action in actions]

    @property
    def has_changes(self) -> bool:
        return bool(self.of(Action.CREATE, Action.UPDATE, Action.DELETE))

    def summary(self) -> dict[str, int]:
        counts = {action.value: 0 for action in Action}
        for change in self.changes:
            counts[change.action.value] += 1
        counts["drift"] = sum(1 for c in self.changes if c.drift)
        return counts


@dataclass(frozen=True)
class LiveObject:
    """An agent or policy as the database holds it. ``fields`` are the managed fields (agent:
    name, description, status; policy: name, agent, agent_id, rules, priority, enabled,
    mode);
    ``applied`` is what the controller last wrote (None when unmanaged)."""

    kind: str
    id: str
    name: str
    fields: Mapping[str, Any]
    managed: bool
    applied: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class LiveState:
    agents: Sequence[LiveObject] = ()
    policies: Sequence[LiveObject] = ()
    #: ids the last successful apply left managed (an object of it deleted through the API
    #: is drift, not a new object)
    inventory: frozenset[str] = field(default_factory=frozenset)
    #: ids the repository declares that objects of another workspace hold (never adoptable)
    elsewhere: frozenset[str] = field(default_factory=frozenset)


def agent_fields(agent: DesiredAgent) -> dict[str, Any]:
    """The fields the repository manages on an agent (status only when the file sets it)."""
    out: dict[str, Any] = {"name": agent.name, "description": agent.description}
    if agent.status is not None:
        out["status"] = agent.status
    return out


def policy_fields(policy: DesiredPolicy) -> dict[str, Any]:
    return {
        "name": policy.name,
        "agent": policy.agent,
        "agent_id": policy.agent_id,
        "rules": policy.rules,
        "priority": policy.priority,
        "enabled": policy.enabled,
        "mode": policy.mode,
    }


def build_plan(
    repo: Repo, live: LiveState, *, prune_agents: bool = False, adopt: bool = False
) -> Plan:
    """The changes that make ``live`` what ``repo`` declares. Agents before policies on the
    way up (creates, updates), policies before agents on the way down (deletes), so a policy
    moves to its agent's new id before the old agent goes."""
    agents = _plan_kind(
        "Agent",
        {a.id: (a, agent_fields(a)) for a in repo.agents.values()},
        live.agents,
        live,
        adopt,
    )
    policies = _plan_kind(
        "Policy",
        {p.id: (p, policy_fields(p)) for p in repo.policies.values()},
        live.policies,
        live,
        adopt,
    )
    agents = [_retire(c, repo, prune_agents) for c in agents]
    down = (Action.DELETE, Action.ORPHAN)  # an orphan is a delete not made: listed with them
    return Plan(
        tuple(c for c in agents + policies if c.action not in down)
        + tuple(c for c in policies + agents if c.action in down)
    )


def _plan_kind(
    kind: str,
    desired: dict[str, tuple[DesiredAgent | DesiredPolicy, dict[str, Any]]],
    live: Sequence[LiveObject],
    state: LiveState,
    adopt: bool,
) -> list[Change]:
    by_id = {obj.id: obj for obj in live}
    unmanaged_names = {_identity(obj): obj for obj in live if not obj.managed}
    out: list[Change] = []
    for object_id, (wanted, fields) in sorted(desired.items(), key=lambda kv: kv[1][0].name):
        if object_id in state.elsewhere:
            out.append(_held_elsewhere(kind, wanted, object_id, fields))
            continue
        current = by_id.get(object_id) or unmanaged_names.get(_identity_of(kind, fields))
        change = _plan_object(kind, wanted, object_id, fields, current, state.inventory, adopt)
        if change is not None:
            out.append(change)
    for obj in sorted(live, key=lambda o: o.name):
        if obj.managed and obj.id not in desired:
            out.append(Change(Action.DELETE, kind, obj.name, obj.id, obj.fields.get("agent"),
                              dict(obj.fields), None, _removed(obj.fields)))  # fmt: skip
    return out


def _plan_object(
    kind: str,
    wanted: DesiredAgent | DesiredPolicy,
    object_id: str,
    fields: dict[str, Any],
    current: LiveObject | None,
    inventory: frozenset[str],
    adopt: bool,
) -> Change | None:
    """One declared object against what the database holds under its id (or, unmanaged, its
    name): None when they already agree."""
    source = f"{wanted.document.file}:{wanted.document.line}"
    agent = getattr(wanted, "agent", None)
    if current is None:
        note = "drift: deleted outside the repository" if object_id in inventory else None
        return Change(Action.CREATE, kind, wanted.name, object_id, agent, None, fields,
                      _created(fields), source, note)  # fmt: skip
    if not current.managed:
        return _conflict(kind, wanted.name, object_id, agent, current, fields, source, adopt)
    changed = tuple(_field_changes(current, fields))
    if not changed:
        return None
    return Change(Action.UPDATE, kind, wanted.name, object_id, agent, dict(current.fields),
                  fields, changed, source)  # fmt: skip


def _identity(obj: LiveObject) -> tuple[str, ...]:
    return _identity_of(obj.kind, obj.fields)


def _identity_of(kind: str, fields: Mapping[str, Any]) -> tuple[str, ...]:
    """What makes two objects the same by name: an agent's name; a policy's name and agent."""
    return (kind, str(fields["name"]), str(fields.get("agent") or ""))


def _conflict(
    kind: str,
    name: str,
    object_id: str,
    agent: str | None,
    clash: LiveObject,
    fields: Mapping[str, Any],
    source: str,
    adopt: bool,
) -> Change:
    """``before`` is the unmanaged object, ``after`` what the repository wants it to be. With
    ``adopt``, an unmanaged object with the same id is taken over: an update."""
    before = dict(clash.fields)
    if clash.id == object_id and adopt:
        note = f"adopted: this {kind.lower()} was not managed by the repository until now"
        return Change(Action.UPDATE, kind, name, object_id, agent, before, fields,
                      tuple(_field_changes(clash, fields)), source, note)  # fmt: skip
    if clash.id == object_id:
        note = (
            f"{kind.lower()} {object_id} exists but is not managed by the repository; "
            "apply --adopt to take it over"
        )
    else:
        note = (
            f"an unmanaged {kind.lower()} named '{clash.name}' exists (id {clash.id}); "
            f"set metadata.id: {clash.id} in the file to adopt it, or rename one of them"
        )
    return Change(Action.CONFLICT, kind, name, object_id, agent, before, fields, (), source, note)


def _held_elsewhere(
    kind: str, wanted: DesiredAgent | DesiredPolicy, object_id: str, fields: Mapping[str, Any]
) -> Change:
    """A conflict with an object of another workspace: nothing of that object is shown (not
    even that it is managed), and no flag takes it over."""
    document = wanted.document
    source = f"{document.file}:{document.line}"
    noun = kind.lower()
    if document.pinned_id is not None:
        where = f"{document.file}:{document.locate('metadata.id')[0]}"
        note = (
            f"{where}: metadata.id {object_id} is the id of {_article(noun)} {noun} of another "
            "workspace (ids are unique across workspaces); remove metadata.id, so that an id "
            "is derived for this workspace, or pin another id"
        )
    else:
        note = (
            f"{source}: the id {object_id} derived for this {noun} is the id of "
            f"{_article(noun)} {noun} of another workspace (pinned there); pin another id "
            "with metadata.id"
        )
    agent = getattr(wanted, "agent", None)
    return Change(Action.CONFLICT, kind, wanted.name, object_id, agent, None, fields, (),
                  source, note)  # fmt: skip


def _article(noun: str) -> str:
    return "an" if noun[:1] in "aeiou" else "a"


def _retire(change: Change, repo: Repo, prune_agents: bool) -> Change:
    """A managed agent the repository no longer declares under its id: deleted with
    --prune-agents, else kept (its policies are pruned or moved either way, and it falls to
    default deny). When the repository declares its name under another id, say where its
    policies went."""
    if change.action is not Action.DELETE:
        return change
    successor = repo.agents.get(change.name)
    moved = None
    if successor is not None:
        moved = f"the repository declares '{change.name}' under the id {successor.id}"
        moved += f", and its policies with it; id {change.id} is"
    if prune_agents:
        return replace(change, note=moved and f"{moved} deleted with its audit log")
    kept = "kept (apply --prune-agents deletes it and its audit log)"
    note = f"{moved} {kept}" if moved else f"gone from the repository; {kept}"
    return Change(Action.ORPHAN, change.kind, change.name, change.id, None, change.before,
                  None, (), None, note)  # fmt: skip


def _created(fields: Mapping[str, Any]) -> tuple[FieldChange, ...]:
    return tuple(FieldChange((name,), ABSENT, value) for name, value in fields.items())


def _removed(fields: Mapping[str, Any]) -> tuple[FieldChange, ...]:
    return tuple(FieldChange((name,), value, ABSENT) for name, value in fields.items())


def _field_changes(current: LiveObject, desired: Mapping[str, Any]) -> Iterator[FieldChange]:
    """Drift is a live value that is not what the controller last wrote. A field it has no
    record of writing (an object being adopted, a field the managed spec gained after the
    object was last applied, a status first set in the file) cannot have drifted."""
    applied = current.applied or {}
    for name, wanted in desired.items():
        have = current.fields.get(name, ABSENT)
        for path, before, after in diff_values((name,), have, wanted):
            drift = name in applied and not same(_at(applied, path), _at(current.fields, path))
            yield FieldChange(path, before, after, drift)


def diff_values(
    path: tuple[str | int, ...], before: Any, after: Any
) -> Iterator[tuple[tuple[str | int, ...], Any, Any]]:
    """(path, before, after) for each differing leaf: mappings member by member, lists of
    mappings (rules) item by item, anything else (a tool list, an enum) as one value."""
    if isinstance(before, dict) and isinstance(after, dict):
        for key in sorted(before.keys() | after.keys()):
            yield from diff_values((*path, key), before.get(key, ABSENT), after.get(key, ABSENT))
    elif _records(before) and _records(after):
        for index in range(max(len(before), len(after))):
            old = before[index] if index < len(before) else ABSENT
            new = after[index] if index < len(after) else ABSENT
            yield from diff_values((*path, index), old, new)
    elif not same(before, after):
        yield path, before, after


def _records(value: Any) -> bool:
    return isinstance(value, list) and any(isinstance(item, dict) for item in value)


def same(a: Any, b: Any) -> bool:
    """JSON equality (``core.domain.jsonvalues``), with :data:`ABSENT` equal only to itself."""
    if a is ABSENT or b is ABSENT:
        return a is b
    return jsonvalues.same(a, b)


def _at(value: Any, path: tuple[str | int, ...]) -> Any:
    for part in path:
        if isinstance(part, int):
            if not isinstance(value, list) or part >= len(value):
                return ABSENT
        elif not isinstance(value, Mapping) or part not in value:
            return ABSENT
        value = value[part]
    return value
