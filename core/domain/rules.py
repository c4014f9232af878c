"""Checks on policy rules that JSON Schema cannot express: every ``regex`` compiles under RE2,
every ``timezone`` is an IANA name, ``min`` is not above ``max``.

Run after the schema passed; used by the API on policy writes and by the controller on files.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cache
from importlib import resources
from typing import Any

import re2

from schemas import Problem, format_path


@cache
def known_timezones() -> frozenset[str]:
    """The IANA zone names of the tzdata package: the same set on every host (the system's
    zone directory would add names such as ``localtime`` that depend on the host)."""
    names = resources.files("tzdata").joinpath("zones").read_text(encoding="utf-8").split()
    return frozenset(names) | {"UTC"}


def _options() -> Any:
    options = re2.Options()
    options.log_errors = False  # the reason goes into our error message, not onto stderr
    return options


RE2_OPTIONS = _options()


def compile_regex(pattern: str) -> Any:
    """The RE2 program for ``pattern``; raises ValueError with RE2's reason when it is invalid.

    The engine compiles user patterns through here too: never Python's ``re``, whose
    backtracking makes ``(a+)+$`` take seconds.
    """
    try:
        return re2.compile(pattern, RE2_OPTIONS)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else "invalid pattern"
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise ValueError(str(reason)) from None


def check_rules(rules: Sequence[Any], prefix: tuple[str | int, ...] = ("rules",)) -> list[Problem]:
    """Every semantic problem of schema-valid ``rules``."""
    problems: list[Problem] = []
    # shapes are checked by the schema; anything malformed here is skipped, not re-reported
    for index, rule in enumerate(rules if isinstance(rules, list) else []):
        at = (*prefix, index)
        if not isinstance(rule, dict):
            continue
        parameters = rule.get("parameters")
        for name, constraint in parameters.items() if isinstance(parameters, dict) else []:
            if isinstance(constraint, dict):
                problems += _check_constraint(constraint, (*at, "parameters", name))
        window = rule.get("timeWindow")
        zone = window.get("timezone") if isinstance(window, dict) else None
        if isinstance(zone, str) and zone not in known_timezones():
            problems.append(
                _problem((*at, "timeWindow", "timezone"), "is not an IANA time zone name")
            )
    return problems


def _check_constraint(constraint: dict[str, Any], at: tuple[str | int, ...]) -> list[Problem]:
    problems = []
    if isinstance(constraint.get("regex"), str):
        try:
            compile_regex(constraint["regex"])
        except ValueError as exc:
            problems.append(_problem((*at, "regex"), f"is not a valid RE2 pattern: {exc}"))
    for bound in ("min", "max"):
        value = constraint.get(bound)
        if isinstance(value, float) and not math.isfinite(value):
            problems.append(_problem((*at, bound), "must be a finite number"))
    low, high = constraint.get("min"), constraint.get("max")
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (low, high))
    if numbers and low > high:  # type: ignore[operator]
        problems.append(_problem((*at, "min"), "must not be greater than max"))
    return problems


def _problem(path: tuple[str | int, ...], message: str) -> Problem:
    return Problem(None, None, format_path(path), message)
