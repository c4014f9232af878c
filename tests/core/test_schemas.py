"""The quick checks compiled from schemas/ agree with the full validator.

For every definition of every schema file, and in depth for the policy and document schemas,
``fast_check(ref)(x)`` is True exactly when ``validate(ref, x)`` finds no problem: on random
JSON values, on valid documents with rules of every type, and on valid documents broken the
ways people break them (members removed or added, wrong types, true for 1, 1.0 for 1, duplicate
entries, empty and over-long strings, a rule's members moved to a rule of another type).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

import schemas
from schemas import FILES, _compile_fast, fast_check, load_schema, validate

REF = "authorize.json#/$defs/request"
UUID = "0f8fad5b-d9cb-469f-a165-70867728950e"

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=10,
)
field_values = {
    "agent_id": st.sampled_from([UUID, UUID.upper(), UUID[:-1], "x", ""]) | json_values,
    "tool_name": st.text(min_size=0, max_size=300) | json_values,
    "parameters": st.dictionaries(st.text(max_size=5), json_values, max_size=4) | json_values,
    "extra": json_values,
}
bodies = st.fixed_dictionaries({}, optional={name: values for name, values in field_values.items()})


@settings(max_examples=500)
@given(bodies)
def test_the_quick_check_never_accepts_what_the_schema_refuses(body):
    quick = fast_check(REF)
    assert quick is not None
    assert quick(body) == (validate(REF, body) == [])


@settings(max_examples=200)
@given(st.text(min_size=1, max_size=255))
def test_the_quick_check_accepts_ordinary_requests(tool):
    body = {"agent_id": UUID, "tool_name": tool, "parameters": {"a": 1}}
    assert fast_check(REF)(body) == (validate(REF, body) == [])


# --- valid documents, built from the schemas' own vocabulary ----------------------------------


#: the contract's strings hold no NUL (names, descriptions, tool patterns, regexes, enum values)
TEXT = st.characters(exclude_characters="\x00")


def _text(low: int, high: int) -> st.SearchStrategy[str]:
    """Short strings within [low, high] characters, and the longest allowed one."""
    return st.text(TEXT, min_size=low, max_size=min(high, 12)) | st.just("é" * high)


numbers = st.integers() | st.floats()  # NaN and infinities are JSON Schema numbers too
names = _text(1, 255)
tool_patterns = _text(1, 255) | st.sampled_from(["*", "read_*", "db.?"])
constraints = st.fixed_dictionaries(
    {},
    optional={
        "regex": _text(0, 128),
        "enum": st.lists(st.text(TEXT, max_size=6), min_size=1, max_size=4) | st.just(["v"] * 100),
        "min": numbers,
        "max": numbers,
    },
).filter(bool)
rate_limits = st.fixed_dictionaries(
    {"maxCalls": st.integers(1, 1_000_000), "windowSeconds": st.integers(1, 86400)}
)
hours = st.lists(st.integers(0, 23) | st.sampled_from([0.0, 23.0]), min_size=1, max_size=24)
days = st.lists(st.integers(0, 6), min_size=1, max_size=7)
time_windows = st.fixed_dictionaries(
    {},
    optional={
        "allowedHours": hours.filter(lambda x: len(set(x)) == len(x)),
        "allowedDays": days.filter(lambda x: len(set(x)) == len(x)),
        "timezone": _text(1, 64) | st.sampled_from(["UTC", "Europe/Paris"]),
    },
).filter(lambda w: "allowedHours" in w or "allowedDays" in w)
tool_lists = st.lists(tool_patterns, min_size=1, max_size=4)


def _rule(kind: str, **required: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    # any rule may name its tools; only its own type takes parameters, rateLimit, timeWindow
    return st.fixed_dictionaries(
        {"type": st.just(kind), **required}, optional={"tools": tool_lists}
    )


rules = st.one_of(
    _rule("tool_allowlist"),
    _rule("tool_denylist"),
    _rule(
        "parameter_constraint",
        parameters=st.dictionaries(names, constraints, min_size=1, max_size=3),
    ),
    _rule("rate_limit", rateLimit=rate_limits),
    _rule("time_based", timeWindow=time_windows),
)
rule_lists = st.lists(rules, min_size=1, max_size=5)
policy_options = {"priority": st.integers(0, 1000) | st.just(7.0), "enabled": st.booleans()}
policy_create = st.fixed_dictionaries(
    {"agent_id": st.sampled_from([UUID, UUID.upper()]), "name": names, "rules": rule_lists},
    optional=policy_options,
)
policy_update = st.fixed_dictionaries(
    {}, optional={"name": names, "rules": rule_lists, **policy_options}
)
policy_spec = st.fixed_dictionaries({"agent": names, "rules": rule_lists}, optional=policy_options)
agent_spec = st.fixed_dictionaries(
    {},
    optional={
        "description": _text(0, 2000) | st.none(),
        "status": st.sampled_from(["active", "suspended", "revoked"]),
    },
)
test_cases = st.fixed_dictionaries(
    {"tool": _text(1, 255), "allowed": st.booleans()},
    optional={
        "name": names,
        "parameters": st.dictionaries(st.text(max_size=5), json_values, max_size=3),
        "policy": names,
        "reason": _text(1, 2000),
    },
)
test_spec = st.fixed_dictionaries(
    {
        "agent": names,
        "now": _text(1, 64) | st.just("2026-01-05T10:00:00Z"),
        "cases": st.lists(test_cases, min_size=1, max_size=4),
    }
)
metadata = st.fixed_dictionaries({"name": names}, optional={"id": st.just(UUID)})


def _document(kind: str, spec: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            "apiVersion": st.just("agentauth/v1"),
            "kind": st.just(kind),
            "metadata": metadata,
            "spec": spec,
        }
    )


documents = st.one_of(
    _document("Agent", agent_spec),
    _document("Policy", policy_spec),
    _document("PolicyTest", test_spec),
)

VALID = {
    "policy.json#/$defs/create": policy_create,
    "policy.json#/$defs/update": policy_update,
    "policy.json#/$defs/spec": policy_spec,
    "agent.json#/$defs/spec": agent_spec,
    "document.json": documents,
    "document.json#/$defs/policyTestSpec": test_spec,
}

# --- the same documents, broken --------------------------------------------------------------

NASTY = [None, True, False, 0, 1, -1, 1.0, 1.5, 24, 2**64, math.inf, -math.inf, math.nan, "",
         "x", "x" * 65, "x" * 129, "x" * 256, "x" * 2001, "a\n", [], [1, 1], [""], {}, {"": 1},
         "agentauth/v1"]  # fmt: skip
# words of the schemas' enums: swapping one for another moves a rule or a document between the
# branches of an if/then/else
WORDS = ["tool_allowlist", "tool_denylist", "parameter_constraint", "rate_limit", "time_based",
         "Agent", "Policy", "PolicyTest", "active", "revoked"]  # fmt: skip
KEYS = ["type", "tools", "parameters", "rateLimit", "timeWindow", "maxCalls", "windowSeconds",
        "allowedHours", "allowedDays", "timezone", "regex", "enum", "min", "max", "agent",
        "agent_id", "name", "rules", "priority", "enabled", "apiVersion", "kind", "metadata",
        "spec", "id", "description", "status", "now", "cases", "tool", "allowed", "policy",
        "reason", "unknown", "", "k" * 255, "k" * 256]  # fmt: skip
parameter_maps = st.dictionaries(names, constraints, min_size=1, max_size=3)
fragments = st.one_of(
    rules, constraints, parameter_maps, rate_limits, time_windows, rule_lists, metadata,
    policy_spec, agent_spec, test_spec, test_cases, tool_lists,
)  # fmt: skip
replacements = st.sampled_from(NASTY + WORDS) | json_values | fragments


def _nodes(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    yield path, value
    if isinstance(value, dict):
        children: Any = value.items()
    else:
        children = enumerate(value) if isinstance(value, list) else ()
    for key, child in children:
        yield from _nodes(child, (*path, key))


def _tweaks(value: Any) -> list[Any]:
    """Near misses of ``value``, valid or not: the same number as a float or a bool, a string
    empty or too long, another word of an enum, a list with a duplicate..."""
    if value is None:
        return [0, False, "", "null", [], {}]
    if isinstance(value, bool):
        return [int(value), float(value), str(value).lower(), not value]
    if isinstance(value, int | float):
        near = [float(value), value + 0.5, value - 1, value + 1, -value, value * 1000]
        return [*near, True, False, str(value), None]
    if isinstance(value, str):
        return ["", value * 300, value + "\n", value[:-1], [value], None, *WORDS]
    if isinstance(value, list):
        return [[], value * 2, value + value[:1], value[1:], value[::-1], [value], {"0": value}]
    return [{}, [value], {**value, "unknown": 1}, {"": value}, dict(list(value.items())[1:])]


def _set(document: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    parent = document
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return document


@st.composite
def broken(draw: st.DrawFn, valid: st.SearchStrategy[Any]) -> Any:
    document = copy.deepcopy(draw(valid))
    for _ in range(draw(st.sampled_from([1, 1, 1, 2, 3]))):  # one change keeps many valid
        path, node = draw(st.sampled_from(list(_nodes(document))))
        change = draw(st.sampled_from(["replace", "tweak", "tweak", "remove", "add", "add"]))
        if change == "remove" and path:
            parent = document
            for key in path[:-1]:
                parent = parent[key]
            del parent[path[-1]]
        elif change == "add" and isinstance(node, dict):
            node[draw(st.sampled_from(KEYS))] = copy.deepcopy(draw(replacements))
        elif change == "tweak":
            document = _set(document, path, copy.deepcopy(draw(st.sampled_from(_tweaks(node)))))
        else:  # copies: NASTY's lists and dicts must not change when a later step edits them
            document = _set(document, path, copy.deepcopy(draw(replacements)))
    return document


def _agree(ref: str, instance: Any) -> None:
    quick = fast_check(ref)
    assert quick is not None
    answer = quick(instance)
    assert isinstance(answer, bool)
    assert answer == (validate(ref, instance) == [])


def _slow(examples: int) -> settings:
    # validate takes milliseconds on a whole policy: no deadline
    return settings(
        max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )


@pytest.mark.parametrize("ref", list(VALID))
@_slow(100)
@given(data=st.data())
def test_valid_documents_pass_both_checks(ref, data):
    document = data.draw(VALID[ref])
    assert validate(ref, document) == []
    assert fast_check(ref)(document) is True


@pytest.mark.parametrize("ref", list(VALID))
@_slow(400)
@given(data=st.data())
def test_broken_documents_get_the_same_answer_from_both_checks(ref, data):
    _agree(ref, data.draw(broken(VALID[ref])))


POLICY = {
    "agent": "billing-bot",
    "priority": 10,
    "enabled": True,
    "rules": [
        {"type": "tool_allowlist", "tools": ["read_*", "list_invoices"]},
        {"type": "tool_denylist", "tools": ["delete_*"]},
        {
            "type": "parameter_constraint",
            "tools": ["refund"],
            "parameters": {
                "amount": {"min": 0, "max": 500},
                "currency": {"enum": ["EUR", "USD"]},
                "note": {"regex": "^[a-z ]*$"},
            },
        },
        {"type": "rate_limit", "rateLimit": {"maxCalls": 100, "windowSeconds": 60}},
        {"type": "time_based", "timeWindow": {"allowedHours": [9, 17], "allowedDays": [0, 4]}},
    ],
}
DOCUMENT = {"apiVersion": "agentauth/v1", "kind": "Policy", "metadata": {"name": "p"}}
AMOUNT = ("rules", 2, "parameters", "amount")
RATE = ("rules", 3, "rateLimit")
HOURS = ("rules", 4, "timeWindow", "allowedHours")
REMOVE = object()
# one change each to a valid policy spec, at the edges of what the schema allows
NEAR_MISSES = [
    ((*AMOUNT, "min"), 1.5, True), ((*AMOUNT, "min"), True, False),
    ((*AMOUNT, "max"), math.nan, True), ((*AMOUNT, "max"), math.inf, True),
    ((*AMOUNT, "max"), "500", False), ((*AMOUNT,), {}, False),
    ((*RATE, "maxCalls"), 100.0, True), ((*RATE, "maxCalls"), 100.5, False),
    ((*RATE, "maxCalls"), True, False), ((*RATE, "maxCalls"), 1_000_000, True),
    ((*RATE, "maxCalls"), 1_000_001, False), ((*RATE, "windowSeconds"), 0, False),
    ((*RATE, "windowSeconds"), REMOVE, False), ((*RATE, "extra"), 1, False),
    (HOURS, [1, 0], True), (HOURS, [9, 9], False), (HOURS, [9, 9.0], False),
    (HOURS, [9, True], False), (HOURS, [23.0], True), (HOURS, [24], False), (HOURS, [], False),
    (HOURS, list(range(24)), True), (HOURS, REMOVE, True),
    (("rules", 4, "timeWindow"), {"timezone": "UTC"}, False),
    (("rules", 4, "timeWindow", "timezone"), "", False),
    (("rules", 2, "parameters", ""), {"min": 0}, False),
    (("rules", 2, "parameters", "k" * 255), {"min": 0}, True),
    (("rules", 2, "parameters", "k" * 256), {"min": 0}, False),
    (("rules", 2, "parameters", "currency", "enum"), ["x"] * 100, True),
    (("rules", 2, "parameters", "currency", "enum"), ["x"] * 101, False),
    (("rules", 2, "parameters", "currency", "enum"), [1], False),
    (("rules", 2, "parameters", "note", "regex"), "x" * 128, True),
    (("rules", 2, "parameters", "note", "regex"), "x" * 129, False),
    (("rules", 2, "parameters"), REMOVE, False),
    (("rules", 0, "parameters"), {"a": {"min": 0}}, False),
    (("rules", 0, "rateLimit"), {"maxCalls": 1, "windowSeconds": 1}, False),
    (("rules", 0, "type"), "time_based", False), (("rules", 2, "type"), "tool_denylist", False),
    (("rules", 3, "type"), "tool_allowlist", False), (("rules", 1, "type"), "deny", False),
    (("rules", 0, "tools"), [], False), (("rules", 0, "tools"), ["a", "a"], True),
    (("rules", 0, "tools"), ["*"] * 256, True), (("rules", 0, "tools"), ["*"] * 257, False),
    (("rules", 0, "tools"), ["é" * 255], True), (("rules", 0, "tools"), ["é" * 256], False),
    (("rules", 1, "tools"), REMOVE, True), (("rules", 1, "type"), REMOVE, False),
    (("rules",), [], False), (("rules",), POLICY["rules"] * 10, True),
    (("rules",), POLICY["rules"] * 10 + [POLICY["rules"][0]], False),
    (("priority",), 1000.0, True), (("priority",), 1001, False), (("priority",), False, False),
    (("enabled",), 1, False), (("agent",), "", False), (("agent",), "x" * 255, True),
    (("agent",), "x" * 256, False), (("agent",), REMOVE, False), (("extra",), None, False),
    # no NUL in any string of the contract
    (("agent",), "a\x00", False), (("rules", 0, "tools"), ["a\x00b"], False),
    (("rules", 2, "parameters", "a\x00"), {"min": 0}, False),
    (("rules", 2, "parameters", "note", "regex"), "\x00", False),
    (("rules", 2, "parameters", "currency", "enum"), ["EUR", "\x00"], False),
    (("rules", 2, "parameters", "currency", "enum"), ["\x01\u2028\U0001f600"], True),
]  # fmt: skip
DOCUMENT_MISSES = [
    (("kind",), "Agent", False), (("kind",), "PolicyTest", False), (("kind",), "policy", False),
    (("apiVersion",), "agentauth/v2", False), (("metadata", "id"), UUID.upper(), True),
    (("metadata", "id"), "nope", False), (("metadata", "extra"), 1, False),
    (("spec",), [], False), (("spec",), {}, False), (("spec", "rules", 0, "type"), 1, False),
    (("metadata",), REMOVE, False), (("spec", "extra"), 1, False),
]  # fmt: skip


def _changed(document: Any, path: tuple[Any, ...], value: Any) -> Any:
    document = copy.deepcopy(document)
    if value is REMOVE:
        parent = document
        for key in path[:-1]:
            parent = parent[key]
        del parent[path[-1]]
        return document
    return _set(document, path, copy.deepcopy(value))


@pytest.mark.parametrize(("path", "value", "valid"), NEAR_MISSES)
def test_near_misses_of_a_policy_get_the_same_answer_from_both_checks(path, value, valid):
    spec = _changed(POLICY, path, value)
    assert (validate("policy.json#/$defs/spec", spec) == []) is valid
    _agree("policy.json#/$defs/spec", spec)
    body = {"agent_id": UUID, "name": "p", **{k: v for k, v in spec.items() if k != "agent"}}
    _agree("policy.json#/$defs/create", body)
    _agree("policy.json#/$defs/update", {k: v for k, v in body.items() if k != "agent_id"})
    _agree("document.json", {**DOCUMENT, "spec": spec})


@pytest.mark.parametrize(("path", "value", "valid"), DOCUMENT_MISSES)
def test_near_misses_of_a_document_get_the_same_answer_from_both_checks(path, value, valid):
    document = _changed({**DOCUMENT, "spec": POLICY}, path, value)
    assert (validate("document.json", document) == []) is valid
    _agree("document.json", document)


def _every_definition() -> list[str]:
    refs = []
    for file in FILES:
        document = load_schema(file)
        refs += [f"{file}#/$defs/{name}" for name in document.get("$defs", {})]
        if document.keys() - {"$schema", "$defs", "title", "description"}:
            refs.append(file)  # the file itself is a schema (document.json)
    return refs


@pytest.mark.parametrize("ref", _every_definition())
def test_every_definition_gets_a_quick_check(ref):
    assert fast_check(ref) is not None


@pytest.mark.parametrize("ref", _every_definition())
@_slow(60)
@given(value=json_values | st.dictionaries(st.sampled_from(KEYS), replacements, max_size=6))
def test_random_values_get_the_same_answer_from_both_checks(ref, value):
    _agree(ref, value)


# --- keyword by keyword, against jsonschema itself ------------------------------------------

any_json = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from([0.0, 1.0, 2.5, -1.0])
    | st.floats() | st.integers() | st.text(max_size=3),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner, max_size=3)
    ),
    max_leaves=8,
)  # fmt: skip
KEYWORD_SCHEMAS = [
    True, False, {},
    {"type": "integer"}, {"type": "number"}, {"type": "boolean"}, {"type": "null"},
    {"type": "array"}, {"type": "object"}, {"type": "string"},
    {"type": ["string", "null"], "maxLength": 2}, {"type": ["integer", "boolean"]},
    {"const": 1}, {"const": True}, {"const": 0.0}, {"const": None}, {"const": "a"},
    {"const": [1, {"a": False}]}, {"const": {"a": [1.0]}},
    {"enum": [0, "0", False, [1], {"a": 1}, None]}, {"enum": ["a", "b"]},
    {"minimum": 0, "maximum": 3}, {"minimum": 1.5}, {"type": "integer", "maximum": 2},
    {"minLength": 1, "maxLength": 2}, {"pattern": "^a.$"}, {"type": "string", "pattern": "b"},
    {"items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
    {"type": "array", "items": False}, {"type": "array", "items": {"const": 1}},
    {"required": ["a"], "properties": {"a": {"type": "string"}},
     "additionalProperties": {"type": "integer"}},
    {"properties": {"a": {"not": {}}}, "additionalProperties": False},
    {"type": "object", "properties": {"": {"minimum": 0}}, "required": [""]},
    {"propertyNames": {"maxLength": 1}}, {"minProperties": 1, "maxProperties": 2},
    {"allOf": [{"type": "number"}, {"minimum": 0}]},
    {"anyOf": [{"type": "string"}, {"minimum": 0}]},
    {"oneOf": [{"type": "integer"}, {"minimum": 0}]}, {"not": {"type": "null"}},
    {"if": {"type": "integer"}, "then": {"minimum": 1}, "else": {"type": "string"}},
    {"if": {"required": ["a"]}, "then": {"required": ["b"]}}, {"then": False}, {"else": False},
    {"format": "date-time", "title": "t", "description": "d", "x-message": "m", "default": 1,
     "examples": [1], "$comment": "c", "$defs": {"x": {"unknownKeyword": 1}}},
]  # fmt: skip


@pytest.mark.parametrize("schema", KEYWORD_SCHEMAS)
@settings(max_examples=100, deadline=None)
@given(value=any_json)
def test_each_keyword_means_what_it_means_to_jsonschema(schema, value):
    quick = _compile_fast(schema, "")
    assert quick is not None
    assert quick(value) == Draft202012Validator(schema).is_valid(value)


@settings(max_examples=300, deadline=None)
@given(value=st.lists(any_json, max_size=5))
def test_unique_items_never_accepts_what_jsonschema_refuses(value):
    # jsonschema sorts before comparing and so can miss a duplicate among nested arrays that mix
    # true and 1; the quick check compares as JSON, which is stricter there, never laxer
    if _compile_fast({"uniqueItems": True}, "")(value):
        assert Draft202012Validator({"uniqueItems": True}).is_valid(value)


@pytest.mark.parametrize(
    ("schema", "instance", "valid"),
    [
        ({"type": "integer"}, 1.0, True),
        ({"type": "integer"}, True, False),
        ({"type": "integer"}, math.inf, False),
        ({"type": "number"}, False, False),
        ({"const": 1}, True, False),
        ({"const": True}, 1, False),
        ({"const": 1}, 1.0, True),
        ({"enum": [[1]]}, [True], False),
        ({"enum": [{"a": 0}]}, {"a": False}, False),
        ({"uniqueItems": True}, [1, True], True),
        ({"uniqueItems": True}, [0, False, None, "", [], {}], True),
        ({"uniqueItems": True}, [1, 1.0], False),
        ({"uniqueItems": True}, [{"a": 1, "b": 2}, {"b": 2, "a": 1.0}], False),
        ({"uniqueItems": True}, [[1], [True]], True),
        ({"maxLength": 1}, "😀", True),
        ({"format": "date-time"}, "not an instant", True),
        ({"minimum": 0, "maximum": 1}, math.nan, True),
        ({"properties": {"p": {"not": {}}}}, {"p": None}, False),
        ({"properties": {"p": {"not": {}}}}, {"q": None}, True),
    ],
)
def test_json_values_compare_as_json_not_as_python(schema, instance, valid):
    assert _compile_fast(schema, "")(instance) is valid
    assert Draft202012Validator(schema).is_valid(instance) is valid


def test_unique_items_finds_the_duplicate_jsonschema_misses():
    assert _compile_fast({"uniqueItems": True}, "")([[1], [True], [1]]) is False


@pytest.mark.parametrize(
    "schema",
    [
        {"multipleOf": 2},
        {"type": "object", "properties": {"a": {"patternProperties": {"x": {}}}}},
        {"allOf": [{"type": "string"}, {"unevaluatedProperties": False}]},
        {"type": "decimal"},
        {"pattern": "("},
        {"items": [{"type": "string"}]},
        {"$ref": "nowhere.json"},
        {"$ref": "https://example.com/policy.json"},
        {"$ref": "policy.json#/$defs/missing"},
        {"$ref": "policy.json#anchor"},
    ],
)
def test_schemas_beyond_the_quick_checks_get_none(schema):
    assert _compile_fast(schema, "") is None


@pytest.mark.parametrize(
    "contents",
    [
        {"$ref": "#"},
        {"$defs": {"tree": {"type": "array", "items": {"$ref": "#/$defs/tree"}}},
         "$ref": "#/$defs/tree"},
        {"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/b"}]}, "b": {"not": {"$ref": "#/$defs/a"}}},
         "$ref": "#/$defs/a"},
        {"$ref": "agent.json"},  # agent.json refers back to common.json below
    ],
)  # fmt: skip
def test_recursive_schemas_get_none_instead_of_looping(monkeypatch, contents):
    fake = {"common.json": contents, "agent.json": {"items": {"$ref": "common.json"}}}
    monkeypatch.setattr(schemas, "load_schema", fake.__getitem__)
    assert _compile_fast({"$ref": "common.json"}, "") is None


def test_a_definition_used_twice_is_not_a_cycle():
    quick = _compile_fast(
        {"allOf": [{"$ref": "common.json#/$defs/name"}, {"$ref": "common.json#/$defs/name"}]},
        "",
    )
    assert quick is not None
    assert quick("n") is True
    assert quick("") is False
