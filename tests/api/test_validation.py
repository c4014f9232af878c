"""Request-body validation at every edge the contract draws: each refused body is 400
``VALIDATION_ERROR`` whose ``details`` name the offending field, and changes nothing; each
body just inside a limit is accepted."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

ALLOW = {"type": "tool_allowlist"}
MISSING = object()  # a field left out of the body


def assert_refused(response, field: str) -> Any:
    assert response.status_code == 400, response.get_data(as_text=True)
    error = response.get_json()["error"]
    assert error["code"] == "VALIDATION_ERROR"
    assert error["message"]
    details = error["details"]
    assert all(set(d) == {"field", "message"} and d["message"] for d in details), details
    assert field in [d["field"] for d in details], details
    return details


def with_field(base: dict[str, Any], name: str, value: Any) -> dict[str, Any]:
    body = dict(base)
    if value is MISSING:
        body.pop(name, None)
    else:
        body[name] = value
    return body


def constraint(**members: Any) -> dict[str, Any]:
    return {"type": "parameter_constraint", "parameters": {"x": members}}


def rate(**members: Any) -> dict[str, Any]:
    return {"type": "rate_limit", "rateLimit": {"maxCalls": 1, "windowSeconds": 1, **members}}


def window(**members: Any) -> dict[str, Any]:
    return {"type": "time_based", "timeWindow": members}


@pytest.fixture
def agent(client, admin_headers) -> Any:
    body = {"name": "mailer", "description": "before"}
    response = client.post("/v1/agents", json=body, headers=admin_headers)
    assert response.status_code == 201
    return response.get_json()


@pytest.fixture
def policy(client, admin_headers, agent) -> Any:
    body = {"agent_id": agent["id"], "name": "p", "rules": [ALLOW], "priority": 5}
    response = client.post("/v1/policies", json=body, headers=admin_headers)
    assert response.status_code == 201
    return response.get_json()


def total(client, headers, noun: str) -> int:
    return int(client.get(f"/v1/{noun}", headers=headers).get_json()["pagination"]["total"])


# --- agents -----------------------------------------------------------------------------------

AGENT_CREATE_BAD = {
    "name-0-chars": ("name", "", "name"),
    "name-256-chars": ("name", "n" * 256, "name"),
    "name-missing": ("name", MISSING, "name"),
    "name-null": ("name", None, "name"),
    "name-number": ("name", 7, "name"),
    "name-array": ("name", ["a"], "name"),
    "description-2001-chars": ("description", "d" * 2001, "description"),
    "description-number": ("description", 1, "description"),
    "description-object": ("description", {}, "description"),
    "unknown-field": ("bogus", 1, "bogus"),
    "status-is-not-settable-on-create": ("status", "active", "status"),
    "id-is-not-settable": ("id", "00000000-0000-4000-8000-000000000001", "id"),
    "managed_by-is-not-settable": ("managed_by", "git", "managed_by"),
    "managedBy-is-not-settable": ("managedBy", "git", "managedBy"),
    "createdAt-is-not-settable": ("createdAt", "2020-01-01T00:00:00Z", "createdAt"),
}


@pytest.mark.parametrize(
    ("name", "value", "field"), AGENT_CREATE_BAD.values(), ids=AGENT_CREATE_BAD.keys()
)
def test_agent_create_refuses(client, admin_headers, name, value, field):
    body = with_field({"name": "ok"}, name, value)
    response = client.post("/v1/agents", json=body, headers=admin_headers)
    assert_refused(response, field)
    assert total(client, admin_headers, "agents") == 0


AGENT_CREATE_OK = {
    "name-1-char": {"name": "n"},
    "name-255-chars": {"name": "n" * 255},
    "description-2000-chars": {"name": "n", "description": "d" * 2000},
    "description-null": {"name": "n", "description": None},
    "description-2000-multibyte": {"name": "n", "description": "é" * 2000},
}


@pytest.mark.parametrize("body", AGENT_CREATE_OK.values(), ids=AGENT_CREATE_OK.keys())
def test_agent_create_accepts_the_edges(client, admin_headers, body):
    response = client.post("/v1/agents", json=body, headers=admin_headers)
    assert response.status_code == 201, response.get_data(as_text=True)
    created = response.get_json()
    assert created["name"] == body["name"]
    assert created["description"] == body.get("description")


AGENT_PATCH_BAD = {
    "name-0-chars": ({"name": ""}, "name"),
    "name-256-chars": ({"name": "n" * 256}, "name"),
    "name-null": ({"name": None}, "name"),
    "description-2001-chars": ({"description": "d" * 2001}, "description"),
    "description-number": ({"description": 5}, "description"),
    "status-not-in-enum": ({"status": "deleted"}, "status"),
    "status-wrong-case": ({"status": "Active"}, "status"),
    "status-null": ({"status": None}, "status"),
    "status-empty": ({"status": ""}, "status"),
    "unknown-field": ({"bogus": True}, "bogus"),
    "id-is-not-settable": ({"id": "00000000-0000-4000-8000-000000000001"}, "id"),
    "managed_by-is-not-settable": ({"managed_by": "git"}, "managed_by"),
    "createdAt-is-not-settable": ({"createdAt": "2020-01-01T00:00:00Z"}, "createdAt"),
    "valid-field-with-a-bad-one": ({"name": "fine", "status": "gone"}, "status"),
}


@pytest.mark.parametrize(("body", "field"), AGENT_PATCH_BAD.values(), ids=AGENT_PATCH_BAD.keys())
def test_agent_patch_refuses(client, admin_headers, agent, body, field):
    path = f"/v1/agents/{agent['id']}"
    assert_refused(client.patch(path, json=body, headers=admin_headers), field)
    assert client.get(path, headers=admin_headers).get_json() == agent


AGENT_PATCH_OK = {
    "name-1-char": {"name": "n"},
    "name-255-chars": {"name": "n" * 255},
    "description-2000-chars": {"description": "d" * 2000},
    "description-null": {"description": None},
}


@pytest.mark.parametrize("body", AGENT_PATCH_OK.values(), ids=AGENT_PATCH_OK.keys())
def test_agent_patch_accepts_the_edges(client, admin_headers, agent, body):
    response = client.patch(f"/v1/agents/{agent['id']}", json=body, headers=admin_headers)
    assert response.status_code == 200
    for name, value in body.items():
        assert response.get_json()[name] == value


# --- policies: top-level fields ---------------------------------------------------------------

POLICY_CREATE_BAD = {
    "name-0-chars": ("name", "", "name"),
    "name-256-chars": ("name", "n" * 256, "name"),
    "name-missing": ("name", MISSING, "name"),
    "agent_id-missing": ("agent_id", MISSING, "agent_id"),
    "agent_id-not-a-uuid": ("agent_id", "agent-1", "agent_id"),
    "agent_id-number": ("agent_id", 1, "agent_id"),
    "agent_id-null": ("agent_id", None, "agent_id"),
    "agentId-camel-case": ("agentId", "00000000-0000-4000-8000-000000000001", "agentId"),
    "rules-missing": ("rules", MISSING, "rules"),
    "rules-null": ("rules", None, "rules"),
    "rules-object": ("rules", ALLOW, "rules"),
    "rules-0": ("rules", [], "rules"),
    "rules-51": ("rules", [ALLOW] * 51, "rules"),
    "priority--1": ("priority", -1, "priority"),
    "priority-1001": ("priority", 1001, "priority"),
    "priority-1.5": ("priority", 1.5, "priority"),
    "priority-true": ("priority", True, "priority"),
    "priority-string": ("priority", "1", "priority"),
    "priority-null": ("priority", None, "priority"),
    "enabled-string": ("enabled", "true", "enabled"),
    "enabled-number": ("enabled", 1, "enabled"),
    "enabled-null": ("enabled", None, "enabled"),
    "unknown-field": ("bogus", 1, "bogus"),
    "id-is-not-settable": ("id", "00000000-0000-4000-8000-000000000001", "id"),
    "managed_by-is-not-settable": ("managed_by", "git", "managed_by"),
}


@pytest.mark.parametrize(
    ("name", "value", "field"), POLICY_CREATE_BAD.values(), ids=POLICY_CREATE_BAD.keys()
)
def test_policy_create_refuses(client, admin_headers, agent, name, value, field):
    base = {"agent_id": agent["id"], "name": "p", "rules": [ALLOW]}
    response = client.post(
        "/v1/policies", json=with_field(base, name, value), headers=admin_headers
    )
    assert_refused(response, field)
    assert total(client, admin_headers, "policies") == 0


POLICY_PATCH_BAD = {
    "name-0-chars": ({"name": ""}, "name"),
    "name-256-chars": ({"name": "n" * 256}, "name"),
    "name-null": ({"name": None}, "name"),
    "rules-null": ({"rules": None}, "rules"),
    "rules-0": ({"rules": []}, "rules"),
    "rules-51": ({"rules": [ALLOW] * 51}, "rules"),
    "priority--1": ({"priority": -1}, "priority"),
    "priority-1001": ({"priority": 1001}, "priority"),
    "priority-1.5": ({"priority": 1.5}, "priority"),
    "priority-true": ({"priority": True}, "priority"),
    "priority-null": ({"priority": None}, "priority"),
    "enabled-string": ({"enabled": "false"}, "enabled"),
    "enabled-null": ({"enabled": None}, "enabled"),
    "agent_id-is-not-updatable": ({"agent_id": "00000000-0000-4000-8000-000000000001"}, "agent_id"),
    "unknown-field": ({"bogus": 1}, "bogus"),
    "managed_by-is-not-settable": ({"managed_by": "git"}, "managed_by"),
    "valid-field-with-a-bad-one": ({"name": "fine", "priority": 2000}, "priority"),
}


@pytest.mark.parametrize(("body", "field"), POLICY_PATCH_BAD.values(), ids=POLICY_PATCH_BAD.keys())
def test_policy_patch_refuses(client, admin_headers, policy, body, field):
    path = f"/v1/policies/{policy['id']}"
    assert_refused(client.patch(path, json=body, headers=admin_headers), field)
    assert client.get(path, headers=admin_headers).get_json() == policy


POLICY_OK = {
    "priority-0": {"priority": 0},
    "priority-1000": {"priority": 1000},
    "rules-1": {"rules": [ALLOW]},
    "rules-50": {"rules": [ALLOW] * 50},
    "name-1-char": {"name": "n"},
    "name-255-chars": {"name": "n" * 255},
    "enabled-false": {"enabled": False},
}


@pytest.mark.parametrize("via", ["create", "patch"])
@pytest.mark.parametrize("change", POLICY_OK.values(), ids=POLICY_OK.keys())
def test_policy_accepts_the_edges(client, admin_headers, agent, policy, via, change):
    if via == "create":
        body = {"agent_id": agent["id"], "name": "p", "rules": [ALLOW], **change}
        response = client.post("/v1/policies", json=body, headers=admin_headers)
        assert response.status_code == 201, response.get_data(as_text=True)
    else:
        response = client.patch(f"/v1/policies/{policy['id']}", json=change, headers=admin_headers)
        assert response.status_code == 200, response.get_data(as_text=True)
    for name, value in change.items():
        assert response.get_json()[name] == value


# --- policies: rules --------------------------------------------------------------------------

RULE_BAD = {
    # type
    "type-missing": ({"tools": ["*"]}, "rules[0].type"),
    "type-unknown": ({"type": "tool_maybe"}, "rules[0].type"),
    "type-null": ({"type": None}, "rules[0].type"),
    "rule-not-an-object": ("tool_allowlist", "rules[0]"),
    # tools
    "tools-empty": ({**ALLOW, "tools": []}, "rules[0].tools"),
    "tools-string": ({**ALLOW, "tools": "*"}, "rules[0].tools"),
    "tools-empty-pattern": ({**ALLOW, "tools": [""]}, "rules[0].tools[0]"),
    "tools-number": ({**ALLOW, "tools": [1]}, "rules[0].tools[0]"),
    "tools-pattern-256-chars": ({**ALLOW, "tools": ["t" * 256]}, "rules[0].tools[0]"),
    # unknown members
    "unknown-member-in-rule": ({**ALLOW, "bogus": 1}, "rules[0].bogus"),
    "unknown-member-in-constraint": (constraint(pattern="a"), "rules[0].parameters.x.pattern"),
    "unknown-member-in-rateLimit": (rate(burst=2), "rules[0].rateLimit.burst"),
    "unknown-member-in-timeWindow": (
        window(allowedHours=[1], tz="UTC"),
        "rules[0].timeWindow.tz",
    ),
    # members of another type
    "rateLimit-on-tool_allowlist": (
        {**ALLOW, "rateLimit": {"maxCalls": 1, "windowSeconds": 1}},
        "rules[0].rateLimit",
    ),
    "timeWindow-on-rate_limit": (
        {**rate(), "timeWindow": {"allowedHours": [1]}},
        "rules[0].timeWindow",
    ),
    "parameters-on-tool_denylist": (
        {"type": "tool_denylist", "parameters": {"x": {"min": 1}}},
        "rules[0].parameters",
    ),
    "rateLimit-on-time_based": (
        {**window(allowedDays=[1]), "rateLimit": {"maxCalls": 1, "windowSeconds": 1}},
        "rules[0].rateLimit",
    ),
    # required members of a type
    "parameter_constraint-without-parameters": (
        {"type": "parameter_constraint"},
        "rules[0].parameters",
    ),
    "rate_limit-without-rateLimit": ({"type": "rate_limit"}, "rules[0].rateLimit"),
    "time_based-without-timeWindow": ({"type": "time_based"}, "rules[0].timeWindow"),
    # parameter constraints
    "parameters-empty": (
        {"type": "parameter_constraint", "parameters": {}},
        "rules[0].parameters",
    ),
    "constraint-empty": (constraint(), "rules[0].parameters.x"),
    "constraint-not-an-object": (
        {"type": "parameter_constraint", "parameters": {"x": "^a$"}},
        "rules[0].parameters.x",
    ),
    "regex-129-chars": (constraint(regex="a" * 129), "rules[0].parameters.x.regex"),
    "regex-backreference": (constraint(regex=r"(a)\1"), "rules[0].parameters.x.regex"),
    "regex-lookahead": (constraint(regex="a(?=b)"), "rules[0].parameters.x.regex"),
    "regex-unbalanced": (constraint(regex="(a"), "rules[0].parameters.x.regex"),
    "regex-number": (constraint(regex=1), "rules[0].parameters.x.regex"),
    "enum-101-entries": (
        constraint(enum=[str(i) for i in range(101)]),
        "rules[0].parameters.x.enum",
    ),
    "enum-empty": (constraint(enum=[]), "rules[0].parameters.x.enum"),
    "enum-number-entry": (constraint(enum=[1]), "rules[0].parameters.x.enum[0]"),
    "enum-string": (constraint(enum="a"), "rules[0].parameters.x.enum"),
    "min-greater-than-max": (constraint(min=5, max=1), "rules[0].parameters.x.min"),
    "min-string": (constraint(min="1"), "rules[0].parameters.x.min"),
    "max-boolean": (constraint(max=True), "rules[0].parameters.x.max"),
    # rate limits
    "maxCalls-0": (rate(maxCalls=0), "rules[0].rateLimit.maxCalls"),
    "maxCalls-1000001": (rate(maxCalls=1_000_001), "rules[0].rateLimit.maxCalls"),
    "maxCalls-1.5": (rate(maxCalls=1.5), "rules[0].rateLimit.maxCalls"),
    "maxCalls-string": (rate(maxCalls="10"), "rules[0].rateLimit.maxCalls"),
    "maxCalls-missing": (
        {"type": "rate_limit", "rateLimit": {"windowSeconds": 1}},
        "rules[0].rateLimit.maxCalls",
    ),
    "windowSeconds-0": (rate(windowSeconds=0), "rules[0].rateLimit.windowSeconds"),
    "windowSeconds-86401": (rate(windowSeconds=86401), "rules[0].rateLimit.windowSeconds"),
    "windowSeconds-negative": (rate(windowSeconds=-60), "rules[0].rateLimit.windowSeconds"),
    "windowSeconds-missing": (
        {"type": "rate_limit", "rateLimit": {"maxCalls": 1}},
        "rules[0].rateLimit.windowSeconds",
    ),
    # time windows
    "time_based-without-hours-and-days": (window(), "rules[0].timeWindow"),
    "time_based-with-only-a-timezone": (window(timezone="UTC"), "rules[0].timeWindow"),
    "allowedHours-empty": (window(allowedHours=[]), "rules[0].timeWindow.allowedHours"),
    "allowedHours-24": (window(allowedHours=[24]), "rules[0].timeWindow.allowedHours[0]"),
    "allowedHours--1": (window(allowedHours=[-1]), "rules[0].timeWindow.allowedHours[0]"),
    "allowedHours-duplicate": (window(allowedHours=[3, 3]), "rules[0].timeWindow.allowedHours"),
    "allowedDays-7": (window(allowedDays=[7]), "rules[0].timeWindow.allowedDays[0]"),
    "allowedDays-empty": (window(allowedDays=[]), "rules[0].timeWindow.allowedDays"),
    "allowedDays-name": (window(allowedDays=["monday"]), "rules[0].timeWindow.allowedDays[0]"),
    "timezone-unknown": (
        window(allowedHours=[9], timezone="Mars/Olympus_Mons"),
        "rules[0].timeWindow.timezone",
    ),
    "timezone-offset": (
        window(allowedHours=[9], timezone="+02:00"),
        "rules[0].timeWindow.timezone",
    ),
    "timezone-host-localtime-is-not-iana": (
        window(allowedHours=[9], timezone="localtime"),
        "rules[0].timeWindow.timezone",
    ),
    "timezone-empty": (window(allowedHours=[9], timezone=""), "rules[0].timeWindow.timezone"),
}


def _rule_body(via: str, agent_id: str, rule: Any) -> dict[str, Any]:
    rules = [ALLOW, rule]  # the bad rule second, so the index in the path is checked too
    if via == "create":
        return {"agent_id": agent_id, "name": "p", "rules": rules}
    return {"rules": rules}


@pytest.mark.parametrize("via", ["create", "patch"])
@pytest.mark.parametrize(("rule", "field"), RULE_BAD.values(), ids=RULE_BAD.keys())
def test_policy_refuses_bad_rules(client, admin_headers, agent, policy, via, rule, field):
    body = _rule_body(via, agent["id"], rule)
    field = field.replace("rules[0]", "rules[1]", 1)
    if via == "create":
        response = client.post("/v1/policies", json=body, headers=admin_headers)
    else:
        response = client.patch(f"/v1/policies/{policy['id']}", json=body, headers=admin_headers)
    assert_refused(response, field)
    listed = client.get("/v1/policies", headers=admin_headers).get_json()
    assert listed["data"] == [policy]


RULE_OK = {
    "regex-128-chars": constraint(regex="a" * 128),
    "regex-multibyte-128-chars": constraint(regex="é" * 128),
    "regex-re2-features": constraint(regex=r"^(?i)[a-z0-9._%+-]+@example\.(com|org)$"),
    "enum-100-entries": constraint(enum=[str(i) for i in range(100)]),
    "enum-1-entry": constraint(enum=["only"]),
    "min-equals-max": constraint(min=3, max=3),
    "min-max-fractional-negative": constraint(min=-1.5, max=-0.5),
    "maxCalls-1": rate(maxCalls=1),
    "maxCalls-1000000": rate(maxCalls=1_000_000),
    "windowSeconds-1": rate(windowSeconds=1),
    "windowSeconds-86400": rate(windowSeconds=86400),
    "allowedHours-0-and-23": window(allowedHours=[0, 23]),
    "allowedHours-all-24": window(allowedHours=list(range(24))),
    "allowedDays-0-and-6": window(allowedDays=[0, 6]),
    "timezone-iana": window(allowedDays=[1], timezone="America/Argentina/Buenos_Aires"),
    "timezone-utc": window(allowedDays=[1], timezone="UTC"),
    "tools-pattern-255-chars": {**ALLOW, "tools": ["t" * 255]},
}


@pytest.mark.parametrize("via", ["create", "patch"])
@pytest.mark.parametrize("rule", RULE_OK.values(), ids=RULE_OK.keys())
def test_policy_accepts_rules_at_the_edges(client, admin_headers, agent, policy, via, rule):
    body = _rule_body(via, agent["id"], rule)
    if via == "create":
        response = client.post("/v1/policies", json=body, headers=admin_headers)
        assert response.status_code == 201, response.get_data(as_text=True)
    else:
        response = client.patch(f"/v1/policies/{policy['id']}", json=body, headers=admin_headers)
        assert response.status_code == 200, response.get_data(as_text=True)
    assert response.get_json()["rules"] == body["rules"]


def test_every_problem_is_reported_at_once(client, admin_headers, agent):
    body = {
        "agent_id": agent["id"],
        "name": "",
        "priority": 1001,
        "rules": [rate(maxCalls=0), constraint(regex=r"(a)\1")],
        "bogus": 1,
    }
    response = client.post("/v1/policies", json=body, headers=admin_headers)
    details = assert_refused(response, "name")
    fields = {d["field"] for d in details}
    assert {
        "name",
        "priority",
        "bogus",
        "rules[0].rateLimit.maxCalls",
        "rules[1].parameters.x.regex",
    } <= fields
    assert total(client, admin_headers, "policies") == 0


def test_details_never_echo_the_value_given(client, admin_headers):
    secret = "svc_" + "ab" * 16
    response = client.post("/v1/agents", json={"name": secret * 10}, headers=admin_headers)
    assert_refused(response, "name")
    assert secret not in response.get_data(as_text=True)


# --- API keys ---------------------------------------------------------------------------------

API_KEY_BAD = {
    "name-missing": ("name", MISSING, "name"),
    "name-0-chars": ("name", "", "name"),
    "name-256-chars": ("name", "n" * 256, "name"),
    "name-null": ("name", None, "name"),
    "scopes-missing": ("scopes", MISSING, "scopes"),
    "scopes-empty": ("scopes", [], "scopes"),
    "scopes-duplicate": ("scopes", ["admin", "admin"], "scopes"),
    "scopes-unknown": ("scopes", ["owner"], "scopes[0]"),
    "scopes-wrong-case": ("scopes", ["Admin"], "scopes[0]"),
    "scopes-known-and-unknown": ("scopes", ["read-only", "write"], "scopes[1]"),
    "scopes-string": ("scopes", "admin", "scopes"),
    "scopes-null": ("scopes", None, "scopes"),
    "expiresAt-in-the-past": ("expiresAt", "2020-01-01T00:00:00Z", "expiresAt"),
    "expiresAt-not-a-date": ("expiresAt", "tomorrow", "expiresAt"),
    "expiresAt-impossible-date": ("expiresAt", "2027-02-30T00:00:00Z", "expiresAt"),
    "expiresAt-bad-offset": ("expiresAt", "2027-01-01T00:00:00+25:00", "expiresAt"),
    # a valid date-time whose instant is before year 1 in UTC: past (was 500)
    "expiresAt-before-year-1-in-utc": ("expiresAt", "0001-01-01T00:00:00+01:00", "expiresAt"),
    "expiresAt-empty": ("expiresAt", "", "expiresAt"),
    "expiresAt-number": ("expiresAt", 1893456000, "expiresAt"),
    "unknown-field": ("bogus", 1, "bogus"),
    "key-is-not-settable": ("key", "svc_" + "0" * 32, "key"),
    "prefix-is-not-settable": ("prefix", "svc_000000", "prefix"),
    "id-is-not-settable": ("id", "00000000-0000-4000-8000-000000000001", "id"),
}


@pytest.mark.parametrize(("name", "value", "field"), API_KEY_BAD.values(), ids=API_KEY_BAD.keys())
def test_api_key_create_refuses(client, admin_headers, name, value, field):
    before = total(client, admin_headers, "api-keys")
    body = with_field({"name": "k", "scopes": ["read-only"]}, name, value)
    response = client.post("/v1/api-keys", json=body, headers=admin_headers)
    assert_refused(response, field)
    assert "key" not in response.get_json()
    assert total(client, admin_headers, "api-keys") == before


@pytest.mark.parametrize("seconds_ago", [1, 0.001], ids=["a-second-ago", "a-millisecond-ago"])
def test_api_key_expiry_just_past_is_refused(client, admin_headers, clock, seconds_ago):
    before = total(client, admin_headers, "api-keys")
    moment = clock.moment - timedelta(seconds=seconds_ago)
    body = {"name": "k", "scopes": ["admin"], "expiresAt": moment.isoformat()}
    assert_refused(client.post("/v1/api-keys", json=body, headers=admin_headers), "expiresAt")
    assert total(client, admin_headers, "api-keys") == before


@pytest.mark.parametrize(
    "body",
    [
        {"name": "n", "scopes": ["admin"]},
        {"name": "n" * 255, "scopes": ["read-only"]},
        {"name": "n", "scopes": ["admin", "read-only"], "expiresAt": None},
        {"name": "n", "scopes": ["admin"], "expiresAt": "2099-12-31T23:59:59Z"},
    ],
    ids=["name-1-char", "name-255-chars", "expiresAt-null", "expiresAt-far-future"],
)
def test_api_key_create_accepts_the_edges(client, admin_headers, body):
    response = client.post("/v1/api-keys", json=body, headers=admin_headers)
    assert response.status_code == 201, response.get_data(as_text=True)
    assert response.get_json()["name"] == body["name"]
