"""The one contract: JSON Schema 2020-12 files for every resource, and a small loader.

Each resource's shape is written once, in a ``*.json`` file beside this module. API request
bodies (``api``) and policy-file documents (``controller``) are both checked against these files
through :func:`validate`, which returns every problem, never just the first one.

Schemas refer to each other by relative file name (``common.json#/$defs/name``), so editors that
load a file from disk resolve the same references this loader does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError as SchemaError
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

#: Base URI the files are registered under; relative ``$ref``s resolve against it. Nothing is
#: ever fetched: an unknown reference is an error, not a download.
BASE_URI = "https://agentauth.invalid/schemas/"
FILES = (
    "common.json",
    "agent.json",
    "policy.json",
    "api-key.json",
    "authorize.json",
    "audit.json",
    "document.json",
    "sync-status.json",
)


@dataclass(frozen=True, order=True)
class Problem:
    """One thing wrong with a document: where it is and what is wrong, in words."""

    file: str | None
    line: int | None
    path: str
    message: str
    column: int | None = None
    severity: str = "error"

    def __str__(self) -> str:
        where = f"{self.file}:{self.line or 0}:{self.column or 0}: " if self.file else ""
        return f"{where}{self.path or '$'}: {self.message}"


@cache
def load_schema(file: str) -> dict[str, Any]:
    """The parsed contents of one schema file (cached; never mutate the result)."""
    text = resources.files(__package__).joinpath(file).read_text(encoding="utf-8")
    document: dict[str, Any] = json.loads(text)
    return document


@cache
def _registry() -> Registry[Any]:
    pairs = [
        (BASE_URI + name, Resource.from_contents(load_schema(name), DRAFT202012)) for name in FILES
    ]
    return Registry().with_resources(pairs)


@cache
def validator(ref: str) -> Draft202012Validator:
    """A validator for ``file.json#/$defs/name`` (compiled once per reference)."""
    return Draft202012Validator({"$ref": BASE_URI + ref}, registry=_registry())


def validate(ref: str, instance: Any, prefix: tuple[str | int, ...] = ()) -> list[Problem]:
    """Every problem of ``instance`` against schema ``ref``, sorted by path, as Problems.

    ``prefix`` is prepended to each path, for documents nested in a larger one.
    """
    found: set[Problem] = set()
    for error in validator(ref).iter_errors(instance):
        for path, message in _describe(error):
            found.add(Problem(None, None, format_path(prefix + path), message))
    return sorted(found)


@cache
def fast_check(ref: str) -> Callable[[Any], bool] | None:
    """A quick yes/no for schema ``ref``, compiled from the schema itself, for bodies checked on
    every request. It answers True only for instances the full validator accepts; on False, run
    :func:`validate` for the problems. None when the schema uses keywords it does not know."""
    return _compile_fast(_resolve(load_schema(ref.split("#")[0]), ref), ref.split("#")[0])


_FAST_KEYWORDS = {"type", "required", "properties", "additionalProperties", "minLength",
                  "maxLength", "pattern", "maxProperties", "$ref", "title", "description",
                  "x-message"}  # fmt: skip


def _resolve(document: dict[str, Any], ref: str) -> Any:
    node: Any = document
    for part in ref.partition("#/")[2].split("/"):
        node = node[part] if part else node
    return node


def _compile_fast(schema: Any, file: str) -> Callable[[Any], bool] | None:
    if not isinstance(schema, dict) or not set(schema) <= _FAST_KEYWORDS:
        return None
    if "$ref" in schema:
        target, _, pointer = schema["$ref"].partition("#")
        target = target or file
        return _compile_fast(_resolve(load_schema(target), "#" + pointer), target)
    checks: list[Callable[[Any], bool]] = []
    kind = schema.get("type")
    if kind == "string":
        low, high = schema.get("minLength", 0), schema.get("maxLength", float("inf"))
        pattern = re.compile(schema["pattern"]) if "pattern" in schema else None
        checks.append(
            lambda v: (
                isinstance(v, str)
                and low <= len(v) <= high
                and (pattern is None or pattern.search(v) is not None)
            )
        )
    elif kind == "object":
        props = {}
        for name, sub in schema.get("properties", {}).items():
            compiled = _compile_fast(sub, file)
            if compiled is None:
                return None
            props[name] = compiled
        required = frozenset(schema.get("required", ()))
        closed = schema.get("additionalProperties") is False
        most = schema.get("maxProperties", float("inf"))
        checks.append(
            lambda v: (
                isinstance(v, dict)
                and len(v) <= most
                and required <= v.keys()
                and (not closed or v.keys() <= props.keys())
                and all(check(v[k]) for k, check in props.items() if k in v)
            )
        )
    elif kind is not None or set(schema) - {"title", "description", "x-message"}:
        return None
    return lambda v: all(check(v) for check in checks)


def format_path(parts: tuple[str | int, ...]) -> str:
    """``("rules", 0, "rateLimit")`` -> ``rules[0].rateLimit``."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out


def _describe(error: SchemaError) -> Iterator[tuple[tuple[str | int, ...], str]]:
    """Readable (path, message) pairs for one jsonschema error. Values are never echoed: they
    may be secrets, or a megabyte long."""
    path = tuple(error.absolute_path)
    schema = error.schema if isinstance(error.schema, Mapping) else {}
    custom = schema.get("x-message")
    keyword = error.validator
    if keyword == "required":
        missing = str(error.message).split("'")[1] if "'" in error.message else "?"
        yield (*path, missing), "is required"
    elif keyword == "additionalProperties" and isinstance(error.instance, Mapping):
        known = set(schema.get("properties", {}))
        for extra in sorted(str(k) for k in error.instance if k not in known):
            yield (*path, extra), "unknown field"
    elif custom:
        yield path, str(custom)
    else:
        yield path, _message(str(keyword), error.validator_value)


def _message(keyword: str, value: Any) -> str:
    simple = {
        "minLength": "must not be empty" if value == 1 else f"must be at least {value} characters",
        "maxLength": f"must be at most {value} characters",
        "minimum": f"must be at least {value}",
        "maximum": f"must be at most {value}",
        "minItems": f"must have at least {value} entries",
        "maxItems": f"must have at most {value} entries",
        "minProperties": f"must have at least {value} members",
        "maxProperties": f"must have at most {value} members",
        "uniqueItems": "must not contain duplicates",
        "pattern": "has an invalid format",
        "const": f"must be {json.dumps(value)}",
    }
    if keyword in simple:
        return simple[keyword]
    if keyword == "type":
        kinds = value if isinstance(value, list) else [value]
        return "must be " + " or ".join(_article(k) for k in kinds)
    if keyword == "enum":
        return "must be one of: " + ", ".join(json.dumps(v) for v in value)
    return f"is invalid ({keyword})"


def _article(kind: str) -> str:
    return {"integer": "an integer", "object": "an object", "array": "an array"}.get(
        kind, "null" if kind == "null" else f"a {kind}"
    )
