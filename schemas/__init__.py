"""The one contract: JSON Schema 2020-12 files for every resource, and a small loader.

Each resource's shape is written once, in a ``*.json`` file beside this module. API request
bodies (``api``) and policy-file documents (``controller``) are both checked against these files
through :func:`validate`, which returns every problem, never just the first one.

Schemas refer to each other by relative file name (``common.json#/$defs/name``), so editors that
load a file from disk resolve the same references this loader does.
"""

from __future__ import annotations

import json
import math
import numbers
import re
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any, TypeAlias, cast
from urllib.parse import unquote, urldefrag, urljoin

if TYPE_CHECKING:  # imported when first needed: most checks never need jsonschema (fast_check)
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
)

#: A compiled quick check (:func:`fast_check`): True when the instance is valid.
Check: TypeAlias = Callable[[Any], bool]


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
    """What :func:`validate` returns, answered by :func:`fast_check` when the instance is valid
    (the common case, many times faster); the full validator runs only to describe problems."""
    quick = fast_check(ref)
    if quick is not None and quick(instance):
        return []
    return validate(ref, instance)


@cache
def fast_check(ref: str) -> Check | None:
    """A quick yes/no for schema ``ref``, compiled from the schema itself, for bodies checked on
    every request and documents checked by the thousand.

    It answers True exactly when :func:`validate` finds no problem, for every JSON value
    (strings, numbers, booleans, null, lists, dicts with string keys: what ``json.loads`` and
    the controller's YAML loader make). It can say False where ``validate`` says nothing in
    two corners no schema here reaches: other Python objects, and duplicates jsonschema misses
    (``uniqueItems`` over nested arrays mixing true and 1). On False, run :func:`validate` for
    the problems. None when the schema uses a keyword the quick checks do not implement
    (``_KEYWORDS``) or refers to itself.
    """
    return _compile_fast({"$ref": ref}, "")


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


# --- the quick checks ---------------------------------------------------------------------
# A schema compiles into closures over closures with the semantics of jsonschema's
# Draft202012Validator as validator() builds it. Anything not understood raises _Unsupported
# and the whole reference gets no quick check: a keyword silently skipped would let through
# what validate refuses.

#: Keywords that never change the verdict. ``format`` is one: validator() passes no
#: format_checker, so jsonschema only annotates with it.
_ANNOTATIONS = frozenset(
    {"$schema", "$defs", "$comment", "title", "description", "x-message", "default", "examples",
     "format"}
)  # fmt: skip
_KEYWORDS = _ANNOTATIONS | {
    "type", "enum", "const", "minimum", "maximum", "minLength", "maxLength", "pattern", "items",
    "minItems", "maxItems", "uniqueItems", "properties", "required", "additionalProperties",
    "propertyNames", "minProperties", "maxProperties", "allOf", "anyOf", "oneOf", "not", "if",
    "then", "else", "$ref",
}  # fmt: skip


class _Unsupported(Exception):
    """The schema is beyond the quick checks: an unknown keyword, a cycle, an odd value."""


def _compile_fast(schema: Any, file: str) -> Check | None:
    """The quick check of ``schema``, a part of ``file`` (its relative ``$ref``s start there)."""
    try:
        return _Compiler().compile(schema, file)
    except _Unsupported:
        return None


def _expect(condition: object) -> None:
    if not condition:
        raise _Unsupported


def _always(value: Any) -> bool:
    return True


def _never(value: Any) -> bool:
    return False


def _is_number(value: Any) -> bool:
    # jsonschema's number is any numbers.Number but bool; the type() test is the fast path
    return type(value) in (int, float) or (
        isinstance(value, numbers.Number) and not isinstance(value, bool)
    )


def _is_integer(value: Any) -> bool:
    # 2020-12 counts 1.0 as an integer; Python counts True as one, JSON does not
    if isinstance(value, float):
        return value.is_integer()
    return isinstance(value, int) and not isinstance(value, bool)


_TYPES: dict[str, Check] = {
    "null": lambda v: v is None,
    "boolean": lambda v: isinstance(v, bool),
    "integer": _is_integer,
    "number": _is_number,
    "string": lambda v: isinstance(v, str),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


class _Compiler:
    """One compilation: ``$ref`` targets compiled so far, and those being compiled."""

    def __init__(self) -> None:
        self._done: dict[str, Check] = {}  # a target's check is the same wherever it is used
        self._active: set[str] = set()  # meeting one of these again is a cycle

    def compile(self, schema: Any, file: str) -> Check:
        if isinstance(schema, bool):
            return _always if schema else _never
        _expect(isinstance(schema, dict) and schema.keys() <= _KEYWORDS)
        kind = schema.get("type")
        type_test = _type_check(kind) if "type" in schema else _always
        bodies = {
            "number": _number_body(schema),
            "string": _string_body(schema),
            "array": self._array_body(schema, file),
            "object": self._object_body(schema, file),
        }
        guarded = []
        for group, body in bodies.items():
            if body is None:
                continue
            if kind == group or (group == "number" and kind == "integer"):
                type_test = _both(kind, body)  # the type test is the body's guard: test once
            else:  # a keyword about one type holds for values of every other type
                guarded.append(_unless(group, body))
        applied = self._applicators(schema, file)
        return _all([type_test, *_value_checks(schema), *guarded, *applied])

    def _array_body(self, schema: dict[str, Any], file: str) -> Check | None:
        checks = []
        if "minItems" in schema or "maxItems" in schema:
            checks.append(_size_check(schema, "minItems", "maxItems"))
        if "items" in schema:
            item = self.compile(schema["items"], file)
            checks.append(lambda v: all(map(item, v)))
        unique = schema.get("uniqueItems", False)
        _expect(isinstance(unique, bool))
        if unique:
            checks.append(_unique)
        return _all(checks) if checks else None

    def _object_body(self, schema: dict[str, Any], file: str) -> Check | None:
        checks = []
        if "minProperties" in schema or "maxProperties" in schema:
            checks.append(_size_check(schema, "minProperties", "maxProperties"))
        required = schema.get("required", [])
        _expect(isinstance(required, list) and all(isinstance(n, str) for n in required))
        if required:
            needed = frozenset(required)
            checks.append(lambda v: needed <= v.keys())
        if "properties" in schema or "additionalProperties" in schema:
            checks.append(self._members(schema, file))
        if "propertyNames" in schema:
            names = self.compile(schema["propertyNames"], file)
            checks.append(lambda v: all(map(names, v)))
        return _all(checks) if checks else None

    def _members(self, schema: dict[str, Any], file: str) -> Check:
        """properties and additionalProperties: each member meets exactly one schema."""
        properties = schema.get("properties", {})
        _expect(isinstance(properties, dict))
        known = {name: self.compile(sub, file) for name, sub in properties.items()}
        other = self.compile(schema.get("additionalProperties", True), file)
        if other is _always:  # only the named members matter: look just those up
            return _named_members([(n, c) for n, c in known.items() if c is not _always])
        find = known.get

        def members(value: dict[Any, Any]) -> bool:
            for name, member in value.items():  # noqa: SIM110 (see _all)
                if not find(name, other)(member):
                    return False
            return True

        return members

    def _applicators(self, schema: dict[str, Any], file: str) -> list[Check]:
        checks = []
        if "$ref" in schema:
            checks.append(self._ref(schema["$ref"], file))
        if "allOf" in schema:
            checks.append(_all(self._each(schema["allOf"], file)))
        if "anyOf" in schema:
            checks.append(_any(self._each(schema["anyOf"], file)))
        if "oneOf" in schema:
            checks.append(_one(self._each(schema["oneOf"], file)))
        if "not" in schema:
            checks.append(_negate(self.compile(schema["not"], file)))
        if "if" in schema:  # then and else mean nothing without it
            test = self.compile(schema["if"], file)
            then = self.compile(schema.get("then", True), file)
            otherwise = self.compile(schema.get("else", True), file)
            checks.append(lambda v: then(v) if test(v) else otherwise(v))
        return checks

    def _each(self, schemas: Any, file: str) -> list[Check]:
        _expect(isinstance(schemas, list) and schemas)
        return [self.compile(schema, file) for schema in schemas]

    def _ref(self, ref: Any, file: str) -> Check:
        """The check of a ``$ref`` target, resolved as the registry of validator() would."""
        _expect(isinstance(ref, str))
        uri, fragment = urldefrag(urljoin(BASE_URI + file, ref))
        target = uri.removeprefix(BASE_URI)
        _expect(uri.startswith(BASE_URI) and target in FILES)
        key = f"{target}#{fragment}"
        if key not in self._done:
            _expect(key not in self._active)  # a recursive schema: no quick check
            self._active.add(key)
            self._done[key] = self.compile(_pointer(load_schema(target), fragment), target)
            self._active.remove(key)  # (no finally: _Unsupported abandons the whole compilation)
        return self._done[key]


def _named_members(checks: list[tuple[str, Check]]) -> Check:
    if not checks:
        return _always

    def named_members(value: dict[Any, Any]) -> bool:
        for name, check in checks:  # noqa: SIM110 (see _all)
            if name in value and not check(value[name]):
                return False
        return True

    return named_members


def _pointer(document: Any, fragment: str) -> Any:
    """The part of ``document`` at a JSON-pointer fragment (decoded as ``referencing`` does)."""
    _expect(fragment == "" or fragment.startswith("/"))  # no $anchor names
    node = document
    for token in unquote(fragment).split("/")[1:]:
        try:
            if isinstance(node, list):
                node = node[int(token)]
            else:
                node = node[token.replace("~1", "/").replace("~0", "~")]
        except (LookupError, TypeError, ValueError):
            raise _Unsupported from None
    return node


def _type_check(kind: Any) -> Check:
    kinds = kind if isinstance(kind, list) else [kind]
    _expect(all(isinstance(k, str) and k in _TYPES for k in kinds))
    return _any([_TYPES[k] for k in kinds])


def _value_checks(schema: dict[str, Any]) -> list[Check]:
    checks = []
    if "const" in schema:
        checks.append(_equals_one_of([schema["const"]]))
    if "enum" in schema:
        _expect(isinstance(schema["enum"], list))
        checks.append(_equals_one_of(schema["enum"]))
    return checks


def _equals_one_of(values: list[Any]) -> Check:
    if all(isinstance(value, str) for value in values):  # the common case: a set lookup
        strings = frozenset(values)
        return lambda v: isinstance(v, str) and v in strings
    keys = [_json_key(value) for value in values]

    def equals_one(value: Any) -> bool:
        try:
            return _json_key(value) in keys
        except TypeError:  # an unhashable non-JSON value inside: let validate decide
            return False

    return equals_one


def _json_key(value: Any) -> Hashable:
    """A stand-in for ``value``, equal to another's exactly when the two are equal as JSON
    values: true is not 1 (as Python has it), 1 is 1.0, member order does not count."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, list | tuple):
        return ("array", tuple(map(_json_key, value)))
    if isinstance(value, dict):
        return ("object", frozenset((k, _json_key(v)) for k, v in value.items()))
    key: Hashable = value  # strings, numbers and null, where Python's == is JSON's
    return key


_SCALARS = frozenset({str, int, float})  # no bool: Python's set would take true for 1


def _unique(items: list[Any]) -> bool:
    if set(map(type, items)) <= _SCALARS:  # hours, days, names: Python's == is JSON's here
        return len(set(items)) == len(items)
    # JSON equality, where jsonschema's uniq can miss a duplicate inside nested arrays that mix
    # true and 1 ([[1], [true], [1]]): stricter, so never True where validate says no
    try:
        return len(set(map(_json_key, items))) == len(items)
    except TypeError:  # an unhashable non-JSON value: let validate decide
        return False


def _number_body(schema: dict[str, Any]) -> Check | None:
    if "minimum" not in schema and "maximum" not in schema:
        return None
    low, high = schema.get("minimum", -math.inf), schema.get("maximum", math.inf)
    _expect(_is_number(low) and _is_number(high))
    # refuse only below or above, as jsonschema does, so that NaN passes as it does there
    return lambda v: not (v < low or v > high)


def _string_body(schema: dict[str, Any]) -> Check | None:
    if not schema.keys() & {"minLength", "maxLength", "pattern"}:
        return None
    in_size = _size_check(schema, "minLength", "maxLength")  # len() counts code points
    if "pattern" not in schema:
        return in_size
    _expect(isinstance(schema["pattern"], str))
    try:
        search = re.compile(schema["pattern"]).search  # Python re, as jsonschema uses
    except re.error:
        raise _Unsupported from None
    return lambda v: in_size(v) and search(v) is not None


def _size_check(schema: dict[str, Any], least: str, most: str) -> Check:
    low, high = schema.get(least, 0), schema.get(most, math.inf)
    _expect(_is_number(low) and _is_number(high))
    return lambda v: low <= len(v) <= high


def _all(checks: list[Check]) -> Check:
    checks = [check for check in checks if check is not _always]
    if len(checks) <= 1:
        return checks[0] if checks else _always
    if len(checks) == 2:
        first, second = checks
        return lambda v: first(v) and second(v)

    # loops, not all() over a generator: on these hot paths the generator costs twice the time
    def every(value: Any) -> bool:
        for check in checks:  # noqa: SIM110
            if not check(value):
                return False
        return True

    return every


def _any(checks: list[Check]) -> Check:
    if len(checks) == 1:
        return checks[0]
    return lambda v: any(check(v) for check in checks)


def _one(checks: list[Check]) -> Check:
    def exactly_one(value: Any) -> bool:
        found = False
        for check in checks:
            if check(value):
                if found:
                    return False
                found = True
        return found

    return exactly_one


def _negate(check: Check) -> Check:
    if check is _always:
        return _never  # {"not": {}}: the member may not be there at all
    return lambda v: not check(v)


# the types that are one Python class, tested inline (a call less per schema node)
_CLASSES: dict[str, type] = {"string": str, "array": list, "object": dict}


def _both(kind: str, body: Check) -> Check:
    if kind in _CLASSES:
        cls = _CLASSES[kind]
        return lambda v: isinstance(v, cls) and body(v)
    is_kind = _TYPES[kind]
    return lambda v: is_kind(v) and body(v)


def _unless(kind: str, body: Check) -> Check:
    if kind in _CLASSES:
        cls = _CLASSES[kind]
        return lambda v: not isinstance(v, cls) or body(v)
    is_kind = _TYPES[kind]
    return lambda v: not is_kind(v) or body(v)
