"""Redaction of audit parameters (decisions §4): which keys are secrets, how deep redaction
goes, API keys of this service scrubbed from any string, and two properties: planted secrets
never survive ``redact``, and never reach the stored audit entry through ``POST /v1/authorize``.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.domain.redaction import MASK, is_sensitive, redact

API_KEY = "svc_" + "0123456789abcdef" * 2
OTHER_API_KEY = "svc_" + "FEDCBA9876543210" * 2
API_KEY_PATTERN = re.compile(r"svc_[0-9a-fA-F]{32}")

# ---------------------------------------------------------------------------------------------
# Which keys are sensitive


SENSITIVE = [
    # plurals carry the same secrets
    "secrets",
    "passwords",
    "api_keys",
    "apiKeys",
    "cookies",
    "private_keys",
    "client_secrets",
    "accessTokens",
    "refresh_tokens",
    # the spec's list, as written
    "password",
    "secret",
    "token",
    "key",
    "credential",
    "authorization",
    "api_key",
    "apiKey",
    "access_token",
    "refresh_token",
    # the spec's list in other spellings and cases
    "PASSWORD",
    "Authorization",
    "APIKEY",
    "ApiKey",
    "api-key",
    "X-Api-Key",
    "api.key",
    "Api Key",
    "accessToken",
    "ACCESS_TOKEN",
    "refreshToken",
    "refresh-token",
    # compound names one of whose words is sensitive
    "client_secret",
    "clientSecret",
    "privateKey",
    "private_key",
    "userPassword",
    "db-password",
    "passwd",
    "sessionCookie",
    "Cookie",
    "credentials",
    "awsCredentials",
    "AWS_SECRET_ACCESS_KEY",
    "auth",
    "x_auth_token",
    "OAuthToken",
    "HTTPAuthorization",
    "bearerToken",
    "id_token",
    # decisions §4: a name that contains "secret" is sensitive, this one too (the safe side)
    "secretary",
]

NOT_SENSITIVE = [
    "max_tokens",
    "maxTokens",
    "keyboard",
    "author",
    "authority",
    "tokens",
    "tokenizer",
    "monkey",
    "turkey",
    "keynote",
    "passage",
    "name",
    "query",
    "limit",
    "",
    "svc_abc123",  # a key's display prefix is not a secret
]


@pytest.mark.parametrize("key", SENSITIVE, ids=SENSITIVE)
def test_sensitive_key_value_is_redacted(key):
    redacted = redact({key: "hunter2", "other": "visible"})
    assert redacted == {key: MASK, "other": "visible"}
    assert is_sensitive(key)


@pytest.mark.parametrize("key", NOT_SENSITIVE, ids=[k or "<empty>" for k in NOT_SENSITIVE])
def test_ordinary_key_value_is_kept(key):
    assert redact({key: "visible"}) == {key: "visible"}
    assert not is_sensitive(key)


@pytest.mark.parametrize(
    "value",
    [
        pytest.param({"nested": "x", "deeper": {"a": 1}}, id="object"),
        pytest.param(["a", {"b": "c"}], id="array"),
        pytest.param(12345, id="number"),
        pytest.param(True, id="boolean"),
        pytest.param(None, id="null"),
        pytest.param("", id="empty-string"),
    ],
)
def test_whole_value_under_sensitive_key_is_replaced(value):
    assert redact({"credentials": value}) == {"credentials": MASK}


# ---------------------------------------------------------------------------------------------
# Depth: objects and arrays


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(
            {"outer": {"inner": {"password": "p", "keep": "k"}}},
            {"outer": {"inner": {"password": MASK, "keep": "k"}}},
            id="nested-objects",
        ),
        pytest.param(
            {"items": [{"token": "t", "n": 1}, {"token": "u", "n": 2}]},
            {"items": [{"token": MASK, "n": 1}, {"token": MASK, "n": 2}]},
            id="objects-in-array",
        ),
        pytest.param(
            {"matrix": [[{"apiKey": "a"}], [[{"client_secret": "b"}]]]},
            {"matrix": [[{"apiKey": MASK}], [[{"client_secret": MASK}]]]},
            id="arrays-in-arrays",
        ),
        pytest.param(
            [{"Authorization": "Basic Zm9vOmJhcg=="}, "plain"],
            [{"Authorization": MASK}, "plain"],
            id="array-at-top",
        ),
        pytest.param(
            {"headers": {"X-Api-Key": "abc", "Accept": "json"}, "max_tokens": 512},
            {"headers": {"X-Api-Key": MASK, "Accept": "json"}, "max_tokens": 512},
            id="headers-object",
        ),
        pytest.param(
            {"a": 1, "b": 1.5, "c": False, "d": None, "e": "s", "f": [], "g": {}},
            {"a": 1, "b": 1.5, "c": False, "d": None, "e": "s", "f": [], "g": {}},
            id="nothing-to-redact",
        ),
    ],
)
def test_redaction_descends_into_objects_and_arrays(value, expected):
    assert redact(value) == expected


# ---------------------------------------------------------------------------------------------
# API keys of this service, wherever they appear


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param({"note": API_KEY}, {"note": MASK}, id="whole-value"),
        pytest.param(
            {"header": f"Bearer {API_KEY}"}, {"header": f"Bearer {MASK}"}, id="inside-text"
        ),
        pytest.param(
            {"cmd": f"curl -H 'x: {API_KEY}' && echo {OTHER_API_KEY}"},
            {"cmd": f"curl -H 'x: {MASK}' && echo {MASK}"},
            id="two-keys-one-uppercase",
        ),
        pytest.param(
            {"deep": [{"x": [f"k={API_KEY};"]}]}, {"deep": [{"x": [f"k={MASK};"]}]}, id="nested"
        ),
        pytest.param({API_KEY: "v"}, {MASK: "v"}, id="as-object-key"),
        pytest.param(
            {"cfg": {f"key-for-{API_KEY}-x": 1}}, {"cfg": {f"key-for-{MASK}-x": MASK}}, id="in-key"
        ),
        pytest.param(
            {f"owner {API_KEY}": {"n": 1}}, {f"owner {MASK}": {"n": 1}}, id="in-key-nested-kept"
        ),
        pytest.param([API_KEY, 1, None], [MASK, 1, None], id="in-array"),
        pytest.param(
            {"p": "svc_0123456789abcdef"}, {"p": "svc_0123456789abcdef"}, id="too-short-kept"
        ),
    ],
)
def test_api_keys_are_scrubbed_everywhere(value, expected):
    assert redact(value) == expected


def test_input_is_not_mutated():
    value = {
        "password": "p",
        "list": [{"token": "t"}, API_KEY, [{"secret": {"x": 1}}]],
        API_KEY: {"nested": f"Bearer {API_KEY}"},
        "keep": {"a": [1, 2, 3]},
    }
    before = copy.deepcopy(value)
    redacted = redact(value)
    assert value == before
    assert redacted != before
    # the copy shares no containers with the input
    redacted["keep"]["a"].append(4)
    assert value["keep"]["a"] == [1, 2, 3]


# ---------------------------------------------------------------------------------------------
# Property: planted secrets never survive
#
# Secrets are marked (`~secret~<hex>~`) and ordinary text never contains `~`, so any marker in
# the output is a leak. API keys are `svc_` + 32 hex, planted as values, inside text and as keys.

MAX_DEPTH = 6
SECRET_MARK = "~secret~"

plain_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="~\x00"),
    max_size=10,
)
plain_keys = st.sampled_from(["max_tokens", "keyboard", "author", "tokens", "q", "n"]) | plain_text
secret_marks = st.text(alphabet="0123456789abcdef", min_size=6, max_size=12).map(
    lambda h: f"{SECRET_MARK}{h}~"
)
secret_values = st.recursive(
    secret_marks,
    lambda inner: (
        st.lists(inner, min_size=1, max_size=3)
        | st.dictionaries(plain_keys, inner, min_size=1, max_size=3)
    ),
    max_leaves=6,
)
api_keys = st.text(alphabet="0123456789abcdefABCDEF", min_size=32, max_size=32).map(
    lambda h: "svc_" + h
)
text_with_api_key = st.builds(lambda a, k, b: a + k + b, plain_text, api_keys, plain_text)
SENSITIVE_WORDS = ["password", "passwd", "secret", "token", "key", "credential", "credentials"]
SENSITIVE_WORDS += ["authorization", "auth", "cookie"]
PREFIXES = ["user", "client", "x", "db", "session", "private", "aws", "oauth"]


def _spell(prefix: str, word: str, style: str) -> str:
    if style == "camel":
        return prefix + word.capitalize()
    if style == "pascal":
        return prefix.capitalize() + word.capitalize()
    if style == "upper":
        return f"{prefix}_{word}".upper()
    return prefix + {"snake": "_", "kebab": "-", "dot": ".", "space": " "}[style] + word


sensitive_keys = st.sampled_from(SENSITIVE) | st.builds(
    _spell,
    st.sampled_from(PREFIXES),
    st.sampled_from(SENSITIVE_WORDS),
    st.sampled_from(["camel", "pascal", "upper", "snake", "kebab", "dot", "space"]),
)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | plain_text
    | api_keys
    | text_with_api_key
)


def _planted_object(base: dict[str, Any], plants: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(base)
    out.update(plants)
    return out


def planted_objects(children: st.SearchStrategy[Any], min_plants: int = 0) -> Any:
    """An object of ordinary members plus planted ones: sensitive keys with secret values, and
    API keys as member names."""
    plants = st.lists(st.tuples(sensitive_keys, secret_values), min_size=min_plants, max_size=3)
    keyed = st.lists(st.tuples(api_keys | text_with_api_key, children), max_size=2)
    return st.builds(
        lambda base, p, k: _planted_object(base, p + k),
        st.dictionaries(plain_keys, children, max_size=3),
        plants,
        keyed,
    )


def json_trees(depth: int) -> st.SearchStrategy[Any]:
    if depth == 0:
        return scalars
    children = st.deferred(lambda: json_trees(depth - 1))
    return scalars | st.lists(children, max_size=3) | planted_objects(children)


parameter_trees = planted_objects(st.deferred(lambda: json_trees(MAX_DEPTH - 1)), min_plants=1)


def assert_no_leak(original: Any, redacted: Any) -> None:
    dumped = json.dumps(redacted, ensure_ascii=False)
    assert SECRET_MARK not in dumped
    planted_keys = set(API_KEY_PATTERN.findall(json.dumps(original, ensure_ascii=False)))
    for key in planted_keys:
        assert key not in dumped


@settings(max_examples=300, deadline=None)
@given(tree=json_trees(MAX_DEPTH))
def test_property_no_planted_secret_survives_redaction(tree):
    before = copy.deepcopy(tree)
    redacted = redact(tree)
    assert tree == before  # not mutated
    assert_no_leak(tree, redacted)


@settings(max_examples=100, deadline=None)
@given(tree=parameter_trees)
def test_property_planted_object_always_holds_a_secret_and_loses_it(tree):
    # non-vacuous: the input does carry a planted secret
    assert SECRET_MARK in json.dumps(tree, ensure_ascii=False)
    assert_no_leak(tree, redact(tree))


benign_keys = st.sampled_from(NOT_SENSITIVE) | st.text(alphabet="0123456789", max_size=6)
benign_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | plain_text
)
benign_trees = st.recursive(
    benign_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(benign_keys, inner, max_size=3),
    max_leaves=30,
)


@settings(max_examples=200, deadline=None)
@given(tree=benign_trees)
def test_property_values_without_secrets_are_unchanged(tree):
    assert redact(tree) == tree


# ---------------------------------------------------------------------------------------------
# Property through the real storage: POST /v1/authorize, read the entry back


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    parameters=parameter_trees,
    tool_suffix=st.none() | api_keys,
)
def test_property_stored_audit_entry_holds_no_planted_secret(
    client, admin_headers, parameters, tool_suffix
):
    agent = client.post("/v1/agents", json={"name": "redaction"}, headers=admin_headers).json
    tool_name = "calendar.read" if tool_suffix is None else f"calendar.{tool_suffix}"
    body = {"agent_id": agent["id"], "tool_name": tool_name, "parameters": parameters}
    decision = client.post("/v1/authorize", json=body, headers=admin_headers)
    assert decision.status_code == 200, decision.get_data(as_text=True)

    listed = client.get(
        "/v1/audit-logs", query_string={"agent_id": agent["id"]}, headers=admin_headers
    )
    assert listed.status_code == 200
    (entry,) = listed.json["data"]
    assert entry["id"] == decision.json["auditId"]
    assert_no_leak({"tool": tool_name, "parameters": parameters}, entry)


def test_constraint_on_a_sensitive_parameter_does_not_leak_its_value(client, admin_headers):
    agent = client.post("/v1/agents", json={"name": "a"}, headers=admin_headers).json
    rules = [
        {"type": "parameter_constraint", "parameters": {"password": {"regex": "^ok$"}}},
        {"type": "tool_allowlist", "tools": ["*"]},
    ]
    policy = {"agent_id": agent["id"], "name": "p", "rules": rules}
    assert client.post("/v1/policies", json=policy, headers=admin_headers).status_code == 201
    body = {
        "agent_id": agent["id"],
        "tool_name": "db.login",
        "parameters": {"password": "hunter2-topsecret", "note": f"key {API_KEY}"},
    }
    decision = client.post("/v1/authorize", json=body, headers=admin_headers).json
    assert decision["allowed"] is False

    (entry,) = client.get(
        "/v1/audit-logs", query_string={"agent_id": agent["id"]}, headers=admin_headers
    ).json["data"]
    assert entry["parameters"] == {"password": MASK, "note": f"key {MASK}"}
    dumped = json.dumps(entry)
    assert "hunter2-topsecret" not in dumped
    assert API_KEY not in dumped
