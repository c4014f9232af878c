"""Tool-call parameters as the JSON the service evaluates: what a handler receives (dates,
decimals, enums, dataclasses, pydantic models, tuples, sets) turned into JSON values the way a
policy author expects to constrain them. A value with no faithful JSON form is refused with a
TypeError, never stringified into something a constraint might wrongly pass."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import math
import uuid
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

#: nesting bound: deeper parameters are refused (the service bounds bodies too)
MAX_DEPTH = 64


def to_json(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """``parameters`` as a JSON object; TypeError for keys that are not strings, values with no
    JSON form, NaN and infinities."""
    value = _convert(parameters, "parameters", 0)
    assert isinstance(value, dict)
    return value


def _convert(value: Any, where: str, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise TypeError(f"{where} is nested more than {MAX_DEPTH} levels deep")
    if isinstance(value, enum.Enum):  # before str and int: a StrEnum is both
        return _convert(value.value, where, depth + 1)
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float | Decimal):
        number = float(value)
        if not math.isfinite(number):
            raise TypeError(f"{where} is not a finite number")
        if isinstance(value, Decimal) and value == value.to_integral_value():
            return int(value)
        return number
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, Mapping):
        out = {}
        for key, member in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{where} has a key that is not a string: {type(key).__name__}")
            out[key] = _convert(member, f"{where}.{key}", depth + 1)
        return out
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=repr) if isinstance(value, set | frozenset) else value
        return [_convert(item, f"{where}[{i}]", depth + 1) for i, item in enumerate(items)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return _convert(fields, where, depth + 1)
    dump = getattr(value, "model_dump", None)  # pydantic v2 models, without importing pydantic
    if callable(dump) and not isinstance(value, type):
        return _convert(dump(mode="json"), where, depth + 1)
    raise TypeError(f"{where} is of type {type(value).__name__}, which has no JSON form")
