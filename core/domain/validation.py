"""Input checks shared by the API and the controller: the schema contract, then the semantic
rule checks, all problems at once."""

from __future__ import annotations

from typing import Any

from core.domain import ids
from core.domain.errors import ValidationError
from core.domain.rules import check_rules
from schemas import Problem, check, validate


def problems_of(ref: str, instance: Any) -> list[Problem]:
    """Every problem of ``instance`` against schema ``ref``, rule semantics included."""
    return sorted(set(validate(ref, instance) + _rule_problems(instance)))


def require_valid(ref: str, instance: Any) -> dict[str, Any]:
    """``instance`` when valid, else ValidationError carrying every problem."""
    problems = sorted(set(check(ref, instance) + _rule_problems(instance)))
    if problems:
        raise ValidationError(problems)
    assert isinstance(instance, dict)
    return instance


def _rule_problems(instance: Any) -> list[Problem]:
    if isinstance(instance, dict) and "rules" in instance:
        return check_rules(instance["rules"])
    return []


#: the schema of every name: agents, policies, keys, workspaces, tool names and patterns
NAME = "common.json#/$defs/name"


def require_name(value: str, field: str) -> str:
    """``value`` when it is a valid name (``common.json``'s rules), else ValidationError naming
    ``field``: for names that arrive outside a request body (the CLI's ``--name``,
    ``--workspace``)."""
    if check(NAME, value):
        raise ValidationError(validate(NAME, value, (field,)))
    return value


def require_uuid(value: str, field: str) -> str:
    """The canonical form of a UUID given by a caller, else ValidationError naming ``field``."""
    if not ids.is_uuid(value):
        raise ValidationError.field(field, "must be a UUID")
    return ids.normalize_uuid(value)


#: the schema of a session id (decisions §8): 1 to 255 printable ASCII characters
SESSION_ID = "authorize.json#/$defs/sessionId"


def require_session_id(value: str, field: str = "session_id") -> str:
    """``value`` when it is a valid session id, else ValidationError naming ``field``: for
    session ids given in a query string (the audit filter, an agent's usage)."""
    if check(SESSION_ID, value):
        raise ValidationError.field(field, "must be 1 to 255 printable ASCII characters")
    return value
