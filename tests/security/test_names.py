"""Names and ids a person reads, checked as strictly as they are compared (issue #22, finding 4).

A trailing newline passed the schema patterns: they ended in ``$``, which Python's ``re`` (the
one ``schemas.validate`` runs when jsonschema-rs says no) also matches before a final ``\\n``.
So with a deny on ``shell.exec`` and an allow on ``*``, ``tool_name: "shell.exec\\n"`` was
allowed, and ``agent_id: "<uuid>\\n"`` was accepted and recorded where no filter finds it.

Here: every pattern in the schemas gets one verdict from both validators, a trailing newline
included; every name and id field of every input schema, of the API, of policy files and of the
CLI refuses C0 and C1 controls, Unicode format characters (zero-width, bidirectional, tags), line
separators and a trailing newline, and names refuse leading or trailing whitespace, with a 400
``VALIDATION_ERROR`` naming the field. The API and CLI tests run on both databases.
"""

from __future__ import annotations

import json
import re
import sys
import unicodedata
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import jsonschema
import jsonschema_rs
import pytest
from click.testing import CliRunner

from api.cli import keys as keys_command
from controller.load import SourceFile
from controller.repo import load_repo
from core.domain.errors import ValidationError
from core.domain.validation import NAME
from core.store.keys import ensure_workspace, issue_key
from schemas import FILES, check, format_path, load_schema, validate

UUID = "0f8fad5b-d9cb-469f-a165-70867728950e"
TOOL = "shell.exec"

# --- every pattern, both validators, a trailing newline ---------------------------------------

#: a value each pattern's schema accepts; a pattern added to the schemas needs one here
SAMPLES = {
    load_schema("common.json")["$defs"]["uuid"]["pattern"]: UUID,
    "^[^\\u0000]*$": "text",
    load_schema("common.json")["$defs"]["name"]["allOf"][0]["not"]["pattern"]: "a\u200bb",
    load_schema("common.json")["$defs"]["name"]["allOf"][1]["not"]["pattern"]: "a ",
    load_schema("authorize.json")["$defs"]["sessionId"]["not"]["pattern"]: "caf\u00e9",
    "^svc_[0-9a-f]{6}$": "svc_0a1b2c",
    "^svc_[0-9a-f]{32}$": "svc_" + "0a" * 16,
    "^[0-9a-f]{64}$": "0a" * 32,
    "^[Hh][Tt][Tt][Pp][Ss]?://[!-~]": "https://hooks.example.com/x",
    "[^!-~]": "a b",
}


def _with_patterns(node: Any, where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every (schema) object holding a ``pattern``, with its sibling keywords (lengths)."""
    if isinstance(node, dict):
        if isinstance(node.get("pattern"), str):
            yield where, node
        for key, child in node.items():
            yield from _with_patterns(child, f"{where}/{key}")
    elif isinstance(node, list):
        for i, child in enumerate(node):
            yield from _with_patterns(child, f"{where}/{i}")


PATTERNED = [pair for file in FILES for pair in _with_patterns(load_schema(file), file + "#")]


def _verdicts(schema: dict[str, Any], value: str) -> tuple[bool, bool]:
    """(jsonschema-rs, jsonschema) on ``value``: the two validators ``schemas.check`` runs."""
    quick = jsonschema_rs.validator_for(schema, validate_formats=False)
    return quick.is_valid(value), jsonschema.Draft202012Validator(schema).is_valid(value)


def test_the_schemas_hold_patterns_and_each_has_a_sample():
    assert len(PATTERNED) > 10
    assert {node["pattern"] for _, node in PATTERNED} <= set(SAMPLES)


@pytest.mark.parametrize(("where", "schema"), PATTERNED, ids=[w for w, _ in PATTERNED])
def test_both_validators_agree_on_every_pattern_with_a_trailing_newline(where, schema):
    sample = SAMPLES[schema["pattern"]]
    assert _verdicts(schema, sample) == (True, True)
    for value in (sample + "\n", sample + "\n\n", sample + "\r\n", "\n" + sample, sample + "\r"):
        quick, full = _verdicts(schema, value)
        assert quick == full, f"{where}: {value!r}: jsonschema-rs {quick}, jsonschema {full}"


# --- every name and id field of every input schema ---------------------------------------------

POLICY_BODY = {"agent_id": UUID, "name": "p", "rules": [{"type": "tool_denylist", "tools": [TOOL]}]}
DOC = {"apiVersion": "agentauth/v1", "metadata": {"name": "bot", "id": UUID}}
TEST_SPEC = {
    "agent": "bot",
    "now": "2026-01-05T10:00:00Z",
    "cases": [{"name": "c", "tool": TOOL, "allowed": False, "policy": "p"}],
}
#: (ref, a valid instance, the path of one of its names or ids, "name" or "id")
FIELDS = {
    "agent-create.name": ("agent.json#/$defs/create", {"name": "bot"}, ("name",), "name"),
    "agent-update.name": ("agent.json#/$defs/update", {"name": "bot"}, ("name",), "name"),
    "policy-create.agent_id": ("policy.json#/$defs/create", POLICY_BODY, ("agent_id",), "id"),
    "policy-create.name": ("policy.json#/$defs/create", POLICY_BODY, ("name",), "name"),
    "policy-create.tools": (
        "policy.json#/$defs/create", POLICY_BODY, ("rules", 0, "tools", 0), "name",
    ),
    "policy-update.name": ("policy.json#/$defs/update", {"name": "p"}, ("name",), "name"),
    "policy-spec.agent": (
        "policy.json#/$defs/spec", {"agent": "bot", "rules": POLICY_BODY["rules"]}, ("agent",),
        "name",
    ),
    "api-key-create.name": (
        "api-key.json#/$defs/create", {"name": "k", "scopes": ["admin"]}, ("name",), "name",
    ),
    "authorize.agent_id": (
        "authorize.json#/$defs/request", {"agent_id": UUID, "tool_name": TOOL}, ("agent_id",), "id",
    ),
    "authorize.tool_name": (
        "authorize.json#/$defs/request", {"agent_id": UUID, "tool_name": TOOL}, ("tool_name",),
        "name",
    ),
    "document.metadata.name": (
        "document.json", {**DOC, "kind": "Agent", "spec": {}}, ("metadata", "name"), "name",
    ),
    "document.metadata.id": (
        "document.json", {**DOC, "kind": "Agent", "spec": {}}, ("metadata", "id"), "id",
    ),
    "policy-test.agent": (
        "document.json", {**DOC, "kind": "PolicyTest", "spec": TEST_SPEC}, ("spec", "agent"),
        "name",
    ),
    "policy-test.case.tool": (
        "document.json", {**DOC, "kind": "PolicyTest", "spec": TEST_SPEC},
        ("spec", "cases", 0, "tool"), "name",
    ),
    "policy-test.case.name": (
        "document.json", {**DOC, "kind": "PolicyTest", "spec": TEST_SPEC},
        ("spec", "cases", 0, "name"), "name",
    ),
    "policy-test.case.policy": (
        "document.json", {**DOC, "kind": "PolicyTest", "spec": TEST_SPEC},
        ("spec", "cases", 0, "policy"), "name",
    ),
}  # fmt: skip

#: one of each kind a name must not hold anywhere: C0, DEL, C1, format characters (Cf: soft
#: hyphen, Arabic letter mark, zero-width, bidirectional embeddings, overrides and isolates,
#: word joiner, byte order mark, interlinear annotation, musical and tag characters), line
#: and paragraph separators
REFUSED = (
    "\x00\x01\t\n\x0b\x0c\r\x1b\x1f\x7f\x80\x85\x9f\u00ad\u061c\u180e\u200b\u200c\u200d\u200e"
    "\u200f\u202a\u202b\u202c\u202d\u202e\u2060\u2066\u2067\u2068\u2069\ufeff\ufff9\u2028"
    "\u2029\U0001d173\U000e0001\U000e0041\U000e007f"
)
#: whitespace a name may hold inside but not first or last
SPACES = " \u00a0\u1680\u2003\u202f\u205f\u3000"
BAD_NAMES = [
    *(TOOL + c for c in REFUSED),
    *(c + TOOL for c in REFUSED),
    *("shell" + c + ".exec" for c in REFUSED),
    *(TOOL + s for s in SPACES),
    *(s + TOOL for s in SPACES),
    TOOL + "\n\n",
]
BAD_IDS = [
    UUID + "\n", UUID + "\r\n", "\n" + UUID, UUID[:-1] + "\n", UUID + " ", " " + UUID,
    UUID + "\u200b", "\u202e" + UUID, "\ufeff" + UUID, UUID + "\x00", UUID + "\x85",
    UUID.replace("-", "\u2010"),  # a Unicode hyphen
]  # fmt: skip
GOOD_NAMES = [TOOL, "Shell.Exec", "a b", "a\u00a0b", "é" * 255, "日本語", "emoji 😀", "x"]


def _set(document: Any, path: tuple[str | int, ...], value: Any) -> Any:
    document = json.loads(json.dumps(document))
    parent = document
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return document


@pytest.mark.parametrize(("ref", "valid", "path", "kind"), FIELDS.values(), ids=FIELDS.keys())
def test_every_name_and_id_field_refuses_controls_format_characters_and_newlines(
    ref, valid, path, kind
):
    assert check(ref, valid) == []
    for value in BAD_NAMES if kind == "name" else BAD_IDS:
        problems = check(ref, _set(valid, path, value))
        assert problems == validate(ref, _set(valid, path, value)), repr(value)
        assert format_path(path) in [p.path for p in problems], repr(value)
    if kind == "name":
        for value in GOOD_NAMES:
            assert check(ref, _set(valid, path, value)) == [], repr(value)


def _input_definitions() -> Iterator[tuple[str, dict[str, Any]]]:
    """What callers send: request bodies and policy-file documents (not the responses)."""
    for file in FILES:
        for name, schema in load_schema(file).get("$defs", {}).items():
            if name in {"create", "update", "spec", "request", "decide"} or file == "document.json":
                yield f"{file}#/$defs/{name}", schema
    yield "document.json", load_schema("document.json")


def test_every_name_and_id_property_of_the_inputs_is_a_name_or_a_uuid():
    # a new name or id field must say which of the two it is, so it gets these tests' rules; a
    # session id is the third kind: printable ASCII (decisions §8), tested in test_budgets
    names = {"name", "agent", "policy", "tool", "tool_name"}
    kinds = {"common.json#/$defs/name", "common.json#/$defs/uuid"}
    kinds |= {"#/$defs/sessionId", "authorize.json#/$defs/sessionId"}
    seen = []
    for ref, schema in _input_definitions():
        for where, node in _with_properties(schema, ref):
            for key, member in node.items():
                if key in names or key == "id" or key.endswith("_id"):
                    seen.append(f"{where}.{key}")
                    assert member.get("$ref") in kinds, f"{where}.{key}"
    assert len(seen) >= 12, seen
    tools = load_schema("policy.json")["$defs"]["toolPattern"]
    assert tools["$ref"] == "common.json#/$defs/name"


def _with_properties(node: Any, where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        if isinstance(node.get("properties"), dict):
            yield where, node["properties"]
        for key, child in node.items():
            yield from _with_properties(child, f"{where}/{key}")
    elif isinstance(node, list):
        for i, child in enumerate(node):
            yield from _with_properties(child, f"{where}/{i}")


# --- every control and format character Unicode has, and nothing else --------------------------

REFUSED_CATEGORIES = {"Cc", "Cf", "Zl", "Zp"}
FORBIDDEN = load_schema("common.json")["$defs"]["name"]["allOf"][0]["not"]["pattern"]


#: every character (no surrogate) by its category in this Python's unicodedata
CATEGORY = {
    chr(i): unicodedata.category(chr(i))
    for i in range(sys.maxunicode + 1)
    if not 0xD800 <= i <= 0xDFFF
}


def _characters(categories: set[str]) -> list[str]:
    return [c for c, category in CATEGORY.items() if category in categories]


def test_every_control_format_and_separator_character_is_refused_by_both_validators():
    every = _characters(REFUSED_CATEGORIES)
    assert len(every) > 200
    for c in every:
        assert check(NAME, f"a{c}b"), f"U+{ord(c):04X}"
        assert validate(NAME, f"a{c}b"), f"U+{ord(c):04X}"


def test_no_other_assigned_character_is_refused():
    # Unassigned characters may be refused: the list follows a newer Unicode than this Python's
    forbidden = re.compile(FORBIDDEN)
    allowed = REFUSED_CATEGORIES | {"Cn"}
    others = _characters(set(CATEGORY.values()) - allowed)
    assert [f"U+{ord(c):04X}" for c in others if forbidden.search(c)] == []
    # and jsonschema-rs finds none of them either, in one string of them all
    assert jsonschema_rs.validator_for({"not": {"pattern": FORBIDDEN}}).is_valid("".join(others))


# --- the API, on both databases -----------------------------------------------------------------

#: a sample of BAD_NAMES and BAD_IDS for the HTTP tests (NUL is refused earlier, as "body")
API_BAD_NAMES = {
    "trailing-newline": TOOL + "\n",
    "trailing-crlf": TOOL + "\r\n",
    "inner-tab": "shell\t.exec",
    "zero-width-space": "shell\u200b.exec",
    "right-to-left-override": "\u202eshell.exec",
    "byte-order-mark": "\ufeffshell.exec",
    "c1-next-line": TOOL + "\x85",
    "line-separator": TOOL + "\u2028",
    "tag-character": TOOL + "\U000e0041",
    "leading-space": " " + TOOL,
    "trailing-no-break-space": TOOL + "\u00a0",
}
API_BAD_IDS = {
    "trailing-newline": UUID + "\n",
    "leading-newline": "\n" + UUID,
    "zero-width-space": UUID + "\u200b",
    "trailing-space": UUID + " ",
}


def _refused(response: Any, field: str) -> list[dict[str, str]]:
    assert response.status_code == 400, response.get_data(as_text=True)
    error = response.get_json()["error"]
    assert error["code"] == "VALIDATION_ERROR"
    assert field in [d["field"] for d in error["details"]], error
    return list(error["details"])


def _count(client: Any, headers: Any, noun: str) -> int:
    return int(client.get(f"/v1/{noun}", headers=headers).get_json()["pagination"]["total"])


@pytest.fixture
def shell_agent(client, admin_headers) -> str:
    """An agent denied shell.exec (priority 100) and allowed everything else (priority 1)."""
    agent = client.post("/v1/agents", json={"name": "bot"}, headers=admin_headers).get_json()
    for name, priority, rule in (
        ("no-shell", 100, {"type": "tool_denylist", "tools": [TOOL]}),
        ("anything", 1, {"type": "tool_allowlist", "tools": ["*"]}),
    ):
        body = {"agent_id": agent["id"], "name": name, "priority": priority, "rules": [rule]}
        assert client.post("/v1/policies", json=body, headers=admin_headers).status_code == 201
    return str(agent["id"])


def _authorize(client: Any, headers: Any, agent_id: str, tool: str) -> Any:
    body = {"agent_id": agent_id, "tool_name": tool, "parameters": {}}
    return client.post("/v1/authorize", json=body, headers=headers)


def test_a_trailing_newline_does_not_slip_past_a_deny(client, admin_headers, shell_agent):
    assert _authorize(client, admin_headers, shell_agent, TOOL).get_json()["outcome"] == "denied"
    _refused(_authorize(client, admin_headers, shell_agent, TOOL + "\n"), "tool_name")
    _refused(_authorize(client, admin_headers, shell_agent + "\n", "search.web"), "agent_id")
    # only the one decision was recorded, and the agent's filter finds it
    assert _count(client, admin_headers, "audit-logs") == 1
    found = client.get(f"/v1/audit-logs?agent_id={shell_agent}", headers=admin_headers)
    assert found.get_json()["pagination"]["total"] == 1


def test_tool_names_are_compared_exactly_and_case_sensitively(client, admin_headers, shell_agent):
    # what the README says: a deny on shell.exec is not a deny on Shell.exec
    for tool, outcome in ((TOOL, "denied"), ("Shell.exec", "allowed"), ("shell.exec.x", "allowed")):
        assert _authorize(client, admin_headers, shell_agent, tool).get_json()["outcome"] == outcome


def test_a_constraint_regex_ending_in_dollar_does_not_match_before_a_final_newline(
    client, admin_headers
):
    # the same hole one level down: parameter regexes run on RE2, whose $ is the end of the
    # text, never Python's re
    agent = client.post("/v1/agents", json={"name": "bot"}, headers=admin_headers).get_json()
    rules = [
        {"type": "parameter_constraint", "parameters": {"q": {"regex": "^[a-z]+$"}}},
        {"type": "tool_allowlist"},
    ]
    body = {"agent_id": agent["id"], "name": "lower-only", "rules": rules}
    assert client.post("/v1/policies", json=body, headers=admin_headers).status_code == 201
    for value, outcome in (("abc", "allowed"), ("abc\n", "denied"), ("abc\n\n", "denied")):
        call = {"agent_id": agent["id"], "tool_name": "search", "parameters": {"q": value}}
        answer = client.post("/v1/authorize", json=call, headers=admin_headers).get_json()
        assert answer["outcome"] == outcome, value


@pytest.mark.parametrize("value", API_BAD_NAMES.values(), ids=API_BAD_NAMES.keys())
def test_the_api_refuses_bad_names_in_every_name_field(client, admin_headers, shell_agent, value):
    policy = client.get(f"/v1/policies?agent_id={shell_agent}", headers=admin_headers)
    policy_id = policy.get_json()["data"][0]["id"]
    agents, policies, keys = (
        _count(client, admin_headers, noun) for noun in ("agents", "policies", "api-keys")
    )
    deny, allow = [{"type": "tool_denylist", "tools": [value]}], [{"type": "tool_allowlist"}]
    tools = "rules[0].tools[0]"
    for method, path, body, field in (
        ("post", "/v1/agents", {"name": value}, "name"),
        ("patch", f"/v1/agents/{shell_agent}", {"name": value}, "name"),
        ("post", "/v1/policies", {"agent_id": shell_agent, "name": value, "rules": allow}, "name"),
        ("post", "/v1/policies", {"agent_id": shell_agent, "name": "p", "rules": deny}, tools),
        ("patch", f"/v1/policies/{policy_id}", {"name": value}, "name"),
        ("patch", f"/v1/policies/{policy_id}", {"rules": deny}, tools),
        ("post", "/v1/api-keys", {"name": value, "scopes": ["read-only"]}, "name"),
        ("post", "/v1/authorize", {"agent_id": shell_agent, "tool_name": value}, "tool_name"),
    ):
        _refused(getattr(client, method)(path, json=body, headers=admin_headers), field)
    agent = client.get(f"/v1/agents/{shell_agent}", headers=admin_headers).get_json()
    assert agent["name"] == "bot"
    assert _count(client, admin_headers, "agents") == agents
    assert _count(client, admin_headers, "policies") == policies
    assert _count(client, admin_headers, "api-keys") == keys
    assert _count(client, admin_headers, "audit-logs") == 0


@pytest.mark.parametrize("value", API_BAD_IDS.values(), ids=API_BAD_IDS.keys())
def test_the_api_refuses_bad_ids_in_bodies_paths_and_filters(
    client, admin_headers, shell_agent, value
):
    mangled = value.replace(UUID, shell_agent)
    body = {"agent_id": mangled, "name": "p", "rules": [{"type": "tool_allowlist"}]}
    _refused(client.post("/v1/policies", json=body, headers=admin_headers), "agent_id")
    _refused(_authorize(client, admin_headers, mangled, "search.web"), "agent_id")
    for noun in ("audit-logs", "policies", "approvals"):
        response = client.get(
            f"/v1/{noun}", query_string={"agent_id": mangled}, headers=admin_headers
        )
        _refused(response, "agent_id")
    for method in ("get", "patch", "delete"):
        response = getattr(client, method)(
            "/v1/agents/" + quote(mangled, safe="-"), json={"name": "x"}, headers=admin_headers
        )
        assert response.status_code == 400, (method, response.get_data(as_text=True))
    assert _count(client, admin_headers, "agents") == 1
    assert _count(client, admin_headers, "audit-logs") == 0


@pytest.mark.parametrize("suffix", ["\n", "\r\n", " ", "\u200b"], ids=repr)
def test_a_webhook_url_refuses_a_trailing_newline_or_invisible_character(
    client, admin_headers, suffix
):
    # refused by the schema itself, with its words (the URL check after it refuses a newline
    # too, but the contract is the schema); a public address, so nothing is resolved
    url = "https://93.184.216.34/in"
    body = {"url": url + suffix, "events": ["approval.requested"]}
    details = _refused(client.post("/v1/webhooks", json=body, headers=admin_headers), "url")
    assert [d["message"] for d in details] == [
        "must be an http:// or https:// URL of printable ASCII characters, without spaces"
    ]
    created = client.post("/v1/webhooks", json={**body, "url": url}, headers=admin_headers)
    assert created.status_code == 201


# --- policy files ---------------------------------------------------------------------------


def _yaml_string(text: str) -> str:
    """A YAML double-quoted scalar spelling every character outside printable ASCII."""
    out = []
    for c in text:
        if c in '"\\':
            out.append("\\" + c)
        elif " " <= c <= "~":
            out.append(c)
        elif ord(c) <= 0xFFFF:
            out.append(f"\\u{ord(c):04X}")
        else:
            out.append(f"\\U{ord(c):08X}")
    return '"' + "".join(out) + '"'


REPO = """\
apiVersion: agentauth/v1
kind: Agent
metadata: {{name: {agent}}}
spec: {{}}
---
apiVersion: agentauth/v1
kind: Policy
metadata: {{name: {policy}}}
spec:
  agent: {agent}
  rules: [{{type: tool_denylist, tools: [{tool}]}}]
---
apiVersion: agentauth/v1
kind: PolicyTest
metadata: {{name: t}}
spec:
  agent: {agent}
  now: "2026-01-05T10:00:00Z"
  cases: [{{tool: {tool}, allowed: false}}]
"""


def _repo(**names: str) -> Any:
    fields = {"agent": "bot", "policy": "no-shell", "tool": TOOL, **names}
    text = REPO.format(**{k: _yaml_string(v) for k, v in fields.items()})
    return load_repo([SourceFile("all.yaml", text.encode())])


@pytest.mark.parametrize("value", API_BAD_NAMES.values(), ids=API_BAD_NAMES.keys())
@pytest.mark.parametrize("field", ["agent", "policy", "tool"])
def test_policy_files_refuse_bad_names_through_the_same_schema(field, value):
    assert _repo().errors == []
    errors = _repo(**{field: value}).errors
    paths = {p.path for p in errors}
    expected = {
        "agent": {"metadata.name", "spec.agent"},
        "policy": {"metadata.name"},
        "tool": {"spec.rules[0].tools[0]", "spec.cases[0].tool"},
    }[field]
    assert expected <= paths, errors


# --- names outside a request body: the CLI and the store ---------------------------------------


@pytest.mark.parametrize("value", ["k\n", " k", "k\u202e", "k\x85"], ids=repr)
@pytest.mark.parametrize("option", ["--name", "--workspace"])
def test_keys_create_refuses_bad_names(database_url, option, value):
    arguments = {"--name": "k", "--workspace": "default", option: value}
    result = CliRunner().invoke(
        keys_command,
        ["create", "--scopes", "read-only", "--db", database_url]
        + [part for pair in arguments.items() for part in pair],
    )
    assert result.exit_code == 2, result.output
    assert option in result.output
    assert "svc_" not in result.output


@pytest.mark.parametrize("value", ["ws\n", "ws ", "w\u200bs", "\u2066ws"], ids=repr)
def test_the_store_refuses_bad_workspace_and_key_names(app, workspace, clock, value):
    db = app.extensions["agentauth"].db
    with pytest.raises(ValidationError) as refused, db.transaction(write=True) as session:
        ensure_workspace(session, value, clock.moment)
    assert {p.path for p in refused.value.problems} == {"workspace"}
    with db.transaction(write=True) as session:
        wid = ensure_workspace(session, workspace.name, clock.moment)
        with pytest.raises(ValidationError) as refused:
            issue_key(session, wid, value, ["read-only"], None, clock.moment)
    assert {p.path for p in refused.value.problems} == {"name"}
