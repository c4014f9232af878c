"""The schema contract as its callers see it: :func:`schemas.check` returns what
:func:`schemas.validate` returns, and both draw the lines the schemas draw.

``check`` asks jsonschema-rs for a yes or no and runs jsonschema (``validate``) for the problems
only on a no. Documents written with the contract's vocabulary pass; one change each to a valid
policy, at the edges of what the schemas allow (bounds, true for 1, 1.0 for 1, NaN and
infinities, duplicates, lengths in code points, NUL), gets the verdict written next to it from
both; values jsonschema-rs reads differently or cannot read still get ``validate``'s answer.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas import FILES, Problem, check, load_schema, validate

UUID = "0f8fad5b-d9cb-469f-a165-70867728950e"

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=10,
)

# --- valid documents, built from the schemas' own vocabulary ----------------------------------


#: the contract's strings hold no NUL (names, descriptions, tool patterns, regexes, enum values)
TEXT = st.characters(exclude_characters="\x00")


def _text(low: int, high: int) -> st.SearchStrategy[str]:
    """Short strings within [low, high] characters, and the longest allowed one."""
    return st.text(TEXT, min_size=low, max_size=min(high, 12)) | st.just("é" * high)


#: a name's characters: no control, format (Cf) or line-separator character; the seven Cf
#: characters Unicode 15 added are unassigned to this Python's unicodedata
NAME_CHARS = st.characters(
    exclude_categories=("Cc", "Cf", "Cs", "Zl", "Zp"),
    exclude_characters="".join(map(chr, range(0x13439, 0x13440))),
)
numbers = st.integers() | st.floats()  # NaN and infinities are JSON Schema numbers too
# names (tool names and patterns too) neither start nor end with whitespace
names = st.text(NAME_CHARS, min_size=1, max_size=12).filter(lambda s: s.strip() == s) | st.just(
    "é" * 255
)
tool_patterns = names | st.sampled_from(["*", "read_*", "db.?"])
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
        parameters=st.dictionaries(_text(1, 255), constraints, min_size=1, max_size=3),
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
    {"tool": names, "allowed": st.booleans()},
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


def _set(document: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    parent = document
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return document


def _answer(ref: str, instance: Any) -> list[Problem]:
    """The problems check finds, after making sure validate finds the same ones."""
    problems = check(ref, instance)
    assert problems == validate(ref, instance)
    return problems


@pytest.mark.parametrize("ref", list(VALID))
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_valid_documents_pass(ref, data):
    # validate takes milliseconds on a whole policy: no deadline
    document = data.draw(VALID[ref])
    assert check(ref, document) == []
    assert validate(ref, document) == []


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
def test_near_misses_of_a_policy(path, value, valid):
    spec = _changed(POLICY, path, value)
    assert (_answer("policy.json#/$defs/spec", spec) == []) is valid
    body = {"agent_id": UUID, "name": "p", **{k: v for k, v in spec.items() if k != "agent"}}
    _answer("policy.json#/$defs/create", body)
    _answer("policy.json#/$defs/update", {k: v for k, v in body.items() if k != "agent_id"})
    _answer("document.json", {**DOCUMENT, "spec": spec})


@pytest.mark.parametrize(("path", "value", "valid"), DOCUMENT_MISSES)
def test_near_misses_of_a_document(path, value, valid):
    document = _changed({**DOCUMENT, "spec": POLICY}, path, value)
    assert (_answer("document.json", document) == []) is valid


class Text(str):
    """A str subclass, which jsonschema-rs refuses to read."""


REQUEST = {"agent_id": UUID, "tool_name": "search.web", "parameters": {"q": "x", "n": 1}}


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("tool_name",), "search.web\n"),  # Python's re matches $ before it: no pattern leans on $
        (("tool_name",), "search.web\n\n"),
        (("agent_id",), UUID + "\n"),
        (("tool_name",), "search.\ud800"),  # a lone surrogate: jsonschema-rs cannot read it
        (("tool_name",), Text("search.web")),
        (("parameters",), {1: "one"}),  # a key that is not a string
        (("parameters",), {"n": math.nan, "m": -math.inf}),
        (("extra",), math.nan),
        (("tool_name",), math.inf),
    ],
)
def test_values_jsonschema_rs_reads_otherwise_get_the_answer_of_validate(path, value):
    _answer("authorize.json#/$defs/request", _changed(REQUEST, path, value))


def _every_definition() -> list[str]:
    refs = []
    for file in FILES:
        document = load_schema(file)
        refs += [f"{file}#/$defs/{name}" for name in document.get("$defs", {})]
        if document.keys() - {"$schema", "$defs", "title", "description"}:
            refs.append(file)  # the file itself is a schema (document.json)
    return refs


@pytest.mark.parametrize("ref", _every_definition())
@pytest.mark.parametrize("value", [{}, [], "", 0, None], ids=repr)
def test_every_definition_is_checked_with_its_references_resolved(ref, value):
    # every $ref resolves among the files themselves, for both libraries: nothing is fetched
    _answer(ref, value)
