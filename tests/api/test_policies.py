"""``/v1/policies``: the success paths of create, read, list (with the ``agent_id`` filter),
update and delete, field by field."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest

from core.store.models import Agent
from tests.api.helpers import assert_error, decide, instant

POLICY_FIELDS = {
    "id",
    "agentId",
    "name",
    "rules",
    "priority",
    "enabled",
    "mode",
    "managedBy",
    "createdAt",
    "updatedAt",
}
ALLOW_ALL = [{"type": "tool_allowlist", "tools": ["*"]}]

#: one valid rule of every type, in its fullest form
RULES = {
    "allowlist": {"type": "tool_allowlist", "tools": ["calendar.*", "mail.send", "db.?"]},
    "allowlist-no-tools": {"type": "tool_allowlist"},
    "denylist": {"type": "tool_denylist", "tools": ["shell.exec"]},
    "parameter-constraint": {
        "type": "parameter_constraint",
        "tools": ["payments.*"],
        "parameters": {
            "amount": {"min": 0, "max": 99.5},
            "currency": {"enum": ["EUR", "USD"]},
            "iban": {"regex": "^[A-Z]{2}[0-9]{2}"},
            "note": {"regex": "x", "enum": ["x"], "min": 1, "max": 1},
        },
    },
    "rate-limit": {
        "type": "rate_limit",
        "tools": ["*"],
        "rateLimit": {"maxCalls": 10, "windowSeconds": 60},
    },
    "time-based": {
        "type": "time_based",
        "timeWindow": {
            "allowedHours": [9, 10, 11, 12, 13, 14, 15, 16],
            "allowedDays": [1, 2, 3, 4, 5],
            "timezone": "Europe/Berlin",
        },
    },
    "time-based-hours-only": {"type": "time_based", "timeWindow": {"allowedHours": [0]}},
    "time-based-days-only": {"type": "time_based", "timeWindow": {"allowedDays": [0, 6]}},
}


@pytest.fixture
def agent(client, admin_headers) -> Any:
    response = client.post("/v1/agents", json={"name": "mailer"}, headers=admin_headers)
    assert response.status_code == 201
    return response.get_json()


def create_policy(client, headers, agent_id: str, **body) -> Any:
    body = {"agent_id": agent_id, "name": "p", "rules": ALLOW_ALL, **body}
    response = client.post("/v1/policies", json=body, headers=headers)
    assert response.status_code == 201, response.get_data(as_text=True)
    return response.get_json()


def total_policies(client, headers) -> int:
    return int(client.get("/v1/policies", headers=headers).get_json()["pagination"]["total"])


# --- create -----------------------------------------------------------------------------------


def test_create_answers_201_with_defaults(client, admin_headers, agent, clock):
    before = clock.moment
    body = {"agent_id": agent["id"], "name": "allow everything", "rules": ALLOW_ALL}
    response = client.post("/v1/policies", json=body, headers=admin_headers)
    after = clock.moment

    assert response.status_code == 201
    policy = response.get_json()
    assert set(policy) == POLICY_FIELDS
    assert str(uuid.UUID(policy["id"])) == policy["id"]
    assert policy["agentId"] == agent["id"]
    assert policy["name"] == "allow everything"
    assert policy["rules"] == ALLOW_ALL
    assert policy["priority"] == 0
    assert policy["enabled"] is True
    assert policy["managedBy"] is None
    assert before < instant(policy["createdAt"]) <= after
    assert policy["updatedAt"] == policy["createdAt"]


@pytest.mark.parametrize(
    ("extra", "priority", "enabled"),
    [
        ({"priority": 0}, 0, True),
        ({"priority": 1000}, 1000, True),
        ({"priority": 7, "enabled": False}, 7, False),
        ({"enabled": True}, 0, True),
    ],
    ids=["priority-0", "priority-1000", "priority-and-disabled", "enabled-explicit"],
)
def test_create_keeps_priority_and_enabled(client, admin_headers, agent, extra, priority, enabled):
    policy = create_policy(client, admin_headers, agent["id"], **extra)
    assert (policy["priority"], policy["enabled"]) == (priority, enabled)
    got = client.get(f"/v1/policies/{policy['id']}", headers=admin_headers).get_json()
    assert (got["priority"], got["enabled"]) == (priority, enabled)


@pytest.mark.parametrize("rule", RULES.values(), ids=RULES.keys())
def test_create_keeps_every_rule_type_exactly(client, admin_headers, agent, rule):
    policy = create_policy(client, admin_headers, agent["id"], rules=[rule])
    assert policy["rules"] == [rule]
    got = client.get(f"/v1/policies/{policy['id']}", headers=admin_headers).get_json()
    assert got["rules"] == [rule]


def test_create_keeps_rule_order(client, admin_headers, agent):
    rules = list(RULES.values())
    policy = create_policy(client, admin_headers, agent["id"], rules=rules)
    got = client.get(f"/v1/policies/{policy['id']}", headers=admin_headers).get_json()
    assert got["rules"] == rules


def test_create_accepts_an_upper_case_agent_id(client, admin_headers, agent):
    policy = create_policy(client, admin_headers, agent["id"].upper())
    assert policy["agentId"] == agent["id"]


def test_create_for_an_unknown_agent_is_404_agent_not_found(client, admin_headers, agent):
    body = {"agent_id": str(uuid.uuid4()), "name": "p", "rules": ALLOW_ALL}
    response = client.post("/v1/policies", json=body, headers=admin_headers)
    assert_error(response, 404, "AGENT_NOT_FOUND")
    assert total_policies(client, admin_headers) == 0


# --- read -------------------------------------------------------------------------------------


@pytest.mark.parametrize("scope", ["admin", "read-only"])
def test_get_returns_the_policy_as_created(client, workspace, admin_headers, agent, scope):
    created = create_policy(client, admin_headers, agent["id"], priority=3)
    response = client.get(f"/v1/policies/{created['id']}", headers=workspace.headers(scope))
    assert response.status_code == 200
    assert response.get_json() == created


def test_get_unknown_id_is_404_policy_not_found(client, admin_headers):
    response = client.get(f"/v1/policies/{uuid.uuid4()}", headers=admin_headers)
    assert_error(response, 404, "POLICY_NOT_FOUND")


def test_list_returns_every_policy_in_creation_order(client, admin_headers, readonly_headers):
    agents = [
        client.post("/v1/agents", json={"name": n}, headers=admin_headers).get_json()
        for n in ("a", "b")
    ]
    created = [
        create_policy(client, admin_headers, agents[i % 2]["id"], name=f"p{i}") for i in range(4)
    ]
    response = client.get("/v1/policies", headers=readonly_headers)
    assert response.status_code == 200
    body = response.get_json()
    assert body["data"] == created
    assert body["pagination"] == {"limit": 100, "offset": 0, "count": 4, "total": 4}


@pytest.fixture
def two_agents_with_policies(client, admin_headers):
    """Agent ``a`` with two policies, agent ``b`` with one, agent ``c`` with none."""
    made = {}
    for name in ("a", "b", "c"):
        made[name] = client.post("/v1/agents", json={"name": name}, headers=admin_headers)
        made[name] = made[name].get_json()
    policies = {
        "a1": create_policy(client, admin_headers, made["a"]["id"], name="a1"),
        "b1": create_policy(client, admin_headers, made["b"]["id"], name="b1"),
        "a2": create_policy(client, admin_headers, made["a"]["id"], name="a2"),
    }
    return made, policies


@pytest.mark.parametrize(
    ("agent_name", "expected"),
    [("a", ["a1", "a2"]), ("b", ["b1"]), ("c", [])],
    ids=["two-policies", "one-policy", "no-policies"],
)
def test_list_filters_by_agent_id(
    client, readonly_headers, two_agents_with_policies, agent_name, expected
):
    agents, policies = two_agents_with_policies
    agent_id = agents[agent_name]["id"]
    response = client.get(f"/v1/policies?agent_id={agent_id}", headers=readonly_headers)
    assert response.status_code == 200
    body = response.get_json()
    assert body["data"] == [policies[name] for name in expected]
    assert body["pagination"]["total"] == len(expected)
    assert body["pagination"]["count"] == len(expected)


def test_list_filter_accepts_an_upper_case_agent_id(
    client, readonly_headers, two_agents_with_policies
):
    agents, policies = two_agents_with_policies
    agent_id = agents["b"]["id"].upper()
    response = client.get(f"/v1/policies?agent_id={agent_id}", headers=readonly_headers)
    assert response.get_json()["data"] == [policies["b1"]]


def test_list_filter_by_an_unknown_agent_is_an_empty_list(
    client, readonly_headers, two_agents_with_policies
):
    response = client.get(f"/v1/policies?agent_id={uuid.uuid4()}", headers=readonly_headers)
    assert response.status_code == 200
    assert response.get_json() == {
        "data": [],
        "pagination": {"limit": 100, "offset": 0, "count": 0, "total": 0},
    }


@pytest.mark.parametrize(
    "value",
    [
        "not-a-uuid",
        "",
        "1234",
        "0123456789abcdef0123456789abcdef",
        "{12345678-1234-4234-8234-123456789abc}",
        "12345678-1234-4234-8234-123456789abcd",
        "0123456789abcdef0123456789abcdef----",
    ],
    ids=["word", "empty", "number", "no-hyphens", "braces", "too-long", "hyphens-misplaced"],
)
def test_list_filter_by_a_malformed_agent_id_is_400(client, readonly_headers, value):
    response = client.get(
        "/v1/policies", query_string={"agent_id": value}, headers=readonly_headers
    )
    assert_error(response, 400, "VALIDATION_ERROR")
    assert "agent_id" in [d["field"] for d in response.get_json()["error"]["details"]]


# --- update -----------------------------------------------------------------------------------


NEW_RULES = [RULES["denylist"], RULES["rate-limit"]]


@pytest.mark.parametrize(
    "change",
    [
        {"name": "renamed"},
        {"rules": NEW_RULES},
        {"priority": 1000},
        {"priority": 0},
        {"enabled": False},
        {"name": "all", "rules": NEW_RULES, "priority": 5, "enabled": False},
        {},
    ],
    ids=["name", "rules", "priority-1000", "priority-0", "enabled", "all", "empty-body"],
)
def test_patch_changes_only_the_supplied_fields(client, admin_headers, agent, clock, change):
    created = create_policy(
        client, admin_headers, agent["id"], name="orig", rules=[RULES["allowlist"]], priority=9
    )
    clock.advance(60)
    response = client.patch(f"/v1/policies/{created['id']}", json=change, headers=admin_headers)

    assert response.status_code == 200
    updated = response.get_json()
    assert set(updated) == POLICY_FIELDS
    expected = {**created, **change}
    for field in ("id", "agentId", "name", "rules", "priority", "enabled", "createdAt"):
        assert updated[field] == expected[field], field
    got = client.get(f"/v1/policies/{created['id']}", headers=admin_headers).get_json()
    assert got == updated


def test_patch_rules_replaces_the_whole_array(client, admin_headers, agent):
    created = create_policy(client, admin_headers, agent["id"], rules=list(RULES.values()))
    response = client.patch(
        f"/v1/policies/{created['id']}", json={"rules": [RULES["denylist"]]}, headers=admin_headers
    )
    assert response.get_json()["rules"] == [RULES["denylist"]]


def test_patch_moves_updated_at_forward(client, admin_headers, agent, clock):
    created = create_policy(client, admin_headers, agent["id"])
    clock.advance(3600)
    response = client.patch(
        f"/v1/policies/{created['id']}", json={"enabled": False}, headers=admin_headers
    )
    updated = response.get_json()
    assert instant(updated["updatedAt"]) >= instant(created["updatedAt"]) + timedelta(hours=1)
    assert updated["createdAt"] == created["createdAt"]


#: one call an hour, then the same rules as JSON written otherwise (integral numbers as 1.0,
#: members in another order): equal rules, not a change
LIMITED = [
    {"type": "rate_limit", "tools": ["*"], "rateLimit": {"maxCalls": 1, "windowSeconds": 3600}},
    {"type": "parameter_constraint", "parameters": {"amount": {"min": 0, "max": 99.5}}},
    {"type": "tool_allowlist", "tools": ["*"]},
]
LIMITED_RESPELT = [
    {"rateLimit": {"windowSeconds": 3600.0, "maxCalls": 1.0}, "tools": ["*"], "type": "rate_limit"},
    {"parameters": {"amount": {"max": 99.5, "min": 0.0}}, "type": "parameter_constraint"},
    {"tools": ["*"], "type": "tool_allowlist"},
]
UNCHANGED = {
    "empty-body": {},
    "same-name": {"name": "orig"},
    "same-priority": {"priority": 9},
    "same-priority-as-9.0": {"priority": 9.0},
    "same-enabled": {"enabled": True},
    "same-rules": {"rules": LIMITED},
    "equal-rules-written-otherwise": {"rules": LIMITED_RESPELT},
    "all-the-same": {"name": "orig", "rules": LIMITED_RESPELT, "priority": 9, "enabled": True},
}


def _policy_version(app, agent_id: str) -> int:
    with app.extensions["agentauth"].db.transaction() as session:
        return int(session.get(Agent, agent_id).policy_version)


@pytest.mark.parametrize("change", UNCHANGED.values(), ids=UNCHANGED.keys())
def test_a_patch_that_changes_nothing_changes_nothing(
    app, client, admin_headers, agent, clock, change
):
    """Not ``updatedAt``, not the rate-limit counters, not the agent's policy version (which
    makes every worker recompile the agent's policies)."""
    created = create_policy(
        client, admin_headers, agent["id"], name="orig", rules=LIMITED, priority=9
    )
    assert decide(client, admin_headers, agent["id"], "x.y", amount=1)["allowed"]
    assert not decide(client, admin_headers, agent["id"], "x.y", amount=1)["allowed"]
    version = _policy_version(app, agent["id"])
    clock.advance(60)

    response = client.patch(f"/v1/policies/{created['id']}", json=change, headers=admin_headers)

    assert response.status_code == 200
    assert response.get_json() == created
    assert client.get(f"/v1/policies/{created['id']}", headers=admin_headers).get_json() == created
    limited = decide(client, admin_headers, agent["id"], "x.y", amount=1)
    assert not limited["allowed"], "the rate-limit counters were reset"
    assert _policy_version(app, agent["id"]) == version


def test_equal_rules_beside_a_real_change_keep_the_rate_limit_counters(
    client, admin_headers, agent, clock
):
    created = create_policy(client, admin_headers, agent["id"], rules=LIMITED, priority=9)
    assert decide(client, admin_headers, agent["id"], "x.y", amount=1)["allowed"]
    clock.advance(60)
    change = {"rules": LIMITED_RESPELT, "priority": 10}
    response = client.patch(f"/v1/policies/{created['id']}", json=change, headers=admin_headers)
    updated = response.get_json()
    assert (updated["priority"], updated["rules"]) == (10, LIMITED)
    assert instant(updated["updatedAt"]) > instant(created["updatedAt"])
    assert not decide(client, admin_headers, agent["id"], "x.y", amount=1)["allowed"]


def test_patch_cannot_move_a_policy_to_another_agent(client, admin_headers, agent):
    other = client.post("/v1/agents", json={"name": "other"}, headers=admin_headers).get_json()
    created = create_policy(client, admin_headers, agent["id"])
    response = client.patch(
        f"/v1/policies/{created['id']}", json={"agent_id": other["id"]}, headers=admin_headers
    )
    assert_error(response, 400, "VALIDATION_ERROR")
    assert [d["field"] for d in response.get_json()["error"]["details"]] == ["agent_id"]
    got = client.get(f"/v1/policies/{created['id']}", headers=admin_headers).get_json()
    assert got == created


def test_patch_unknown_id_is_404_policy_not_found(client, admin_headers):
    response = client.patch(
        f"/v1/policies/{uuid.uuid4()}", json={"name": "x"}, headers=admin_headers
    )
    assert_error(response, 404, "POLICY_NOT_FOUND")


def test_patch_does_not_touch_other_policies(client, admin_headers, agent):
    first = create_policy(client, admin_headers, agent["id"], name="first")
    second = create_policy(client, admin_headers, agent["id"], name="second")
    client.patch(f"/v1/policies/{first['id']}", json={"enabled": False}, headers=admin_headers)
    assert client.get(f"/v1/policies/{second['id']}", headers=admin_headers).get_json() == second


def test_patch_leaves_the_agent_untouched(client, admin_headers, agent):
    created = create_policy(client, admin_headers, agent["id"])
    client.patch(f"/v1/policies/{created['id']}", json={"name": "x"}, headers=admin_headers)
    assert client.get(f"/v1/agents/{agent['id']}", headers=admin_headers).get_json() == agent


# --- delete -----------------------------------------------------------------------------------


def test_delete_answers_204_without_a_body_and_the_policy_is_gone(client, admin_headers, agent):
    doomed = create_policy(client, admin_headers, agent["id"], name="doomed")
    kept = create_policy(client, admin_headers, agent["id"], name="kept")
    response = client.delete(f"/v1/policies/{doomed['id']}", headers=admin_headers)
    assert response.status_code == 204
    assert response.get_data() == b""
    response = client.get(f"/v1/policies/{doomed['id']}", headers=admin_headers)
    assert_error(response, 404, "POLICY_NOT_FOUND")
    assert client.get("/v1/policies", headers=admin_headers).get_json()["data"] == [kept]
    assert client.get(f"/v1/agents/{agent['id']}", headers=admin_headers).status_code == 200


def test_delete_twice_is_404_the_second_time(client, admin_headers, agent):
    policy = create_policy(client, admin_headers, agent["id"])
    assert client.delete(f"/v1/policies/{policy['id']}", headers=admin_headers).status_code == 204
    response = client.delete(f"/v1/policies/{policy['id']}", headers=admin_headers)
    assert_error(response, 404, "POLICY_NOT_FOUND")


def test_delete_unknown_id_is_404_policy_not_found(client, admin_headers, agent):
    kept = create_policy(client, admin_headers, agent["id"])
    response = client.delete(f"/v1/policies/{uuid.uuid4()}", headers=admin_headers)
    assert_error(response, 404, "POLICY_NOT_FOUND")
    assert client.get("/v1/policies", headers=admin_headers).get_json()["data"] == [kept]
