"""Input checks shared by the API and the controller: the schema contract, then the semantic
rule checks, all problems at once."""

from __future__ import annotations

from typing import Any

from core import ids
from core.errors import ValidationError
from core.rules import check_rules
from schemas import Problem, fast_check, validate


def problems_of(ref: str, instance: Any) -> list[Problem]:
    """Every problem of ``instance`` against schema ``ref``, rule semantics included."""
    problems = validate(ref, instance)
    if isinstance(instance, dict) and "rules" in instance:
        problems += check_rules(instance["rules"])
    return sorted(set(problems))


def require_valid(ref: str, instance: Any) -> dict[str, Any]:
    """``instance`` when valid, else ValidationError carrying every problem."""
    quick = fast_check(ref)
    if quick is not None and "rules" not in instance and quick(instance):
        return instance  # type: ignore[no-any-return]
    problems = problems_of(ref, instance)
    if problems:
        raise ValidationError(problems)
    assert isinstance(instance, dict)
    return instance


def require_uuid(value: str, field: str) -> str:
    """The canonical form of a UUID given by a caller, else ValidationError naming ``field``."""
    if not ids.is_uuid(value):
        raise ValidationError.field(field, "must be a UUID")
    return ids.normalize_uuid(value)
