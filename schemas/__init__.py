"""The one contract: JSON Schema 2020-12 files for every resource, and a small loader.

Each resource's shape is written once, in a ``*.json`` file beside this module. API request
bodies (``api``) and policy-file documents (``controller``) are both checked against these files
through :func:`check`, which returns what :func:`validate` returns: every problem, never just
the first one.

Schemas refer to each other by relative file name (``common.json#/$defs/name``), so editors that
load a file from disk resolve the same references this loader does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:  # both imported when first needed (jsonschema alone takes 0.1 s)
    import jsonschema_rs
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import ValidationError as SchemaError
    from referencing import Registry

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
    "approval.json",
    "webhook.json",
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
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT202012

    pairs = [
        (BASE_URI + name, Resource.from_contents(load_schema(name), DRAFT202012)) for name in FILES
    ]
    return Registry().with_resources(pairs)


@cache
def validator(ref: str) -> Draft202012Validator:
    """A validator for ``file.json#/$defs/name`` (compiled once per reference)."""
    from jsonschema import Draft202012Validator

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


def check(ref: str, instance: Any) -> list[Problem]:
    """What :func:`validate` returns. jsonschema-rs, compiled, says whether ``instance`` is
    valid (the common case, for bodies checked on every request and documents checked by the
    thousand); only on a no does jsonschema run, to describe the problems.

    On these schemas jsonschema-rs never says yes where :func:`validate` finds a problem, for
    the values ``json.loads`` and the controller's YAML loader make (``tests/core/
    test_schemas.py`` holds the edges), but one: an integer of more than 4,300 digits (YAML's
    hex form can write one), no number at all to jsonschema-rs, and one jsonschema cannot print
    (ValueError). Where it is stricter it says no and :func:`validate` answers: NaN and
    infinities (not numbers to it), a duplicate among arrays mixing true and 1. No pattern
    leans on ``$``, which Python's ``re`` also matches before a final newline (Rust's
    ``regex`` and ECMA-262 do not): a pattern names what is refused, unanchored, under
    ``not``, or length bounds leave no room for a newline (``tests/security/test_names.py``
    holds every pattern to that). A value it cannot read (a key that is not a string, a
    ``str`` subclass, a lone surrogate) raises ValueError, and :func:`validate` answers too.
    Tuples, which no loader makes, are arrays to it and not to jsonschema.
    """
    quick = _compiled(ref)
    try:
        if quick.is_valid(instance):
            return []
    except ValueError:  # a value jsonschema-rs cannot read: jsonschema answers for it
        pass
    return validate(ref, instance)


@cache
def _compiled(ref: str) -> jsonschema_rs.Validator:
    """The jsonschema-rs validator for ``ref``: the same files, registered under the same URIs,
    with ``format`` an annotation as it is for :func:`validator`, and no retrieval."""
    import jsonschema_rs

    return jsonschema_rs.Draft202012Validator(
        {"$ref": BASE_URI + ref},
        registry=_rs_registry(),
        validate_formats=False,
        offline=True,
    )


@cache
def _rs_registry() -> jsonschema_rs.Registry:
    import jsonschema_rs

    pairs = [(BASE_URI + name, load_schema(name)) for name in FILES]
    return jsonschema_rs.Registry(pairs, draft=jsonschema_rs.Draft202012)


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
    if keyword == "required" and isinstance(error.instance, Mapping):
        # from the schema, not jsonschema's message (its words are its own to change); each
        # missing name has an error of its own, and validate() keeps one Problem per path
        for missing in cast(list[str], error.validator_value):
            if missing not in error.instance:
                yield (*path, str(missing)), "is required"
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
