"""``/v1/agents``: the success paths of create, read, list, update and delete, field by field,
and what deleting an agent takes with it."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest

from tests.api.helpers import assert_error, instant

AGENT_FIELDS = {"id", "name", "description", "status", "managedBy", "createdAt", "updatedAt"}
STATUSES = ["active", "suspended", "revoked"]
ALLOW_ALL = [{"type": "tool_allowlist", "tools": ["*"]}]


def create_agent(client: Any, headers: dict[str, str], **body: Any) -> Any:
    body.setdefault("name", "mailer")
    response = client.post("/v1/agents", json=body, headers=headers)
    assert response.status_code == 201, response.get_data(as_text=True)
    return response.get_json()


def create_policy(client, headers, agent_id: str, name: str = "p") -> Any:
    body = {"agent_id": agent_id, "name": name, "rules": ALLOW_ALL}
    response = client.post("/v1/policies", json=body, headers=headers)
    assert response.status_code == 201, response.get_data(as_text=True)
    return response.get_json()


# --- create -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "description"),
    [
        ({"name": "mailer"}, None),
        ({"name": "mailer", "description": "sends the newsletter"}, "sends the newsletter"),
        ({"name": "mailer", "description": None}, None),
        ({"name": "mailer", "description": ""}, ""),
    ],
    ids=["name-only", "with-description", "description-null", "description-empty"],
)
def test_create_answers_201_with_the_new_agent(client, admin_headers, clock, body, description):
    before = clock.moment
    response = client.post("/v1/agents", json=body, headers=admin_headers)
    after = clock.moment

    assert response.status_code == 201
    assert response.mimetype == "application/json"
    agent = response.get_json()
    assert set(agent) == AGENT_FIELDS
    assert str(uuid.UUID(agent["id"])) == agent["id"]
    assert agent["name"] == "mailer"
    assert agent["description"] == description
    assert agent["status"] == "active"
    assert agent["managedBy"] is None
    assert before < instant(agent["createdAt"]) <= after
    assert agent["updatedAt"] == agent["createdAt"]


def test_create_keeps_unicode_names_as_given(client, admin_headers):
    agent = create_agent(client, admin_headers, name="Zoë's 日本語 agent 🤖")
    got = client.get(f"/v1/agents/{agent['id']}", headers=admin_headers).get_json()
    assert got["name"] == "Zoë's 日本語 agent 🤖"


def test_each_create_makes_a_distinct_agent_even_with_the_same_name(client, admin_headers):
    first = create_agent(client, admin_headers, name="twin")
    second = create_agent(client, admin_headers, name="twin")
    assert first["id"] != second["id"]
    listed = client.get("/v1/agents", headers=admin_headers).get_json()
    assert [a["id"] for a in listed["data"]] == [first["id"], second["id"]]


# --- read -------------------------------------------------------------------------------------


@pytest.mark.parametrize("scope", ["admin", "read-only"])
def test_get_returns_the_agent_as_created(client, workspace, admin_headers, scope):
    created = create_agent(client, admin_headers, description="d")
    response = client.get(f"/v1/agents/{created['id']}", headers=workspace.headers(scope))
    assert response.status_code == 200
    assert response.get_json() == created


def test_get_accepts_the_id_in_upper_case(client, admin_headers):
    created = create_agent(client, admin_headers)
    response = client.get(f"/v1/agents/{created['id'].upper()}", headers=admin_headers)
    assert response.status_code == 200
    assert response.get_json() == created


def test_get_unknown_id_is_404_agent_not_found(client, admin_headers):
    response = client.get(f"/v1/agents/{uuid.uuid4()}", headers=admin_headers)
    assert_error(response, 404, "AGENT_NOT_FOUND")


def test_list_returns_every_agent_of_the_workspace_in_creation_order(
    client, admin_headers, readonly_headers
):
    created = [create_agent(client, admin_headers, name=f"agent-{i}") for i in range(3)]
    response = client.get("/v1/agents", headers=readonly_headers)
    assert response.status_code == 200
    body = response.get_json()
    assert set(body) == {"data", "pagination"}
    assert body["data"] == created
    assert body["pagination"] == {"limit": 100, "offset": 0, "count": 3, "total": 3}


def test_list_of_an_empty_workspace_is_empty(client, admin_headers):
    body = client.get("/v1/agents", headers=admin_headers).get_json()
    assert body == {"data": [], "pagination": {"limit": 100, "offset": 0, "count": 0, "total": 0}}


# --- update -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"name": "renamed"}, {"name": "renamed", "description": "old", "status": "active"}),
        ({"description": "new"}, {"name": "mailer", "description": "new", "status": "active"}),
        ({"description": None}, {"name": "mailer", "description": None, "status": "active"}),
        ({"description": ""}, {"name": "mailer", "description": "", "status": "active"}),
        ({"status": "suspended"}, {"name": "mailer", "description": "old", "status": "suspended"}),
        (
            {"name": "n", "description": None, "status": "revoked"},
            {"name": "n", "description": None, "status": "revoked"},
        ),
        ({}, {"name": "mailer", "description": "old", "status": "active"}),
    ],
    ids=[
        "name",
        "description",
        "description-null-clears",
        "description-empty",
        "status",
        "all-three",
        "empty-body",
    ],
)
def test_patch_changes_only_the_supplied_fields(client, admin_headers, clock, change, expected):
    created = create_agent(client, admin_headers, description="old")
    clock.advance(60)
    response = client.patch(f"/v1/agents/{created['id']}", json=change, headers=admin_headers)

    assert response.status_code == 200
    updated = response.get_json()
    assert set(updated) == AGENT_FIELDS
    assert {k: updated[k] for k in expected} == expected
    assert updated["id"] == created["id"]
    assert updated["createdAt"] == created["createdAt"]
    assert client.get(f"/v1/agents/{created['id']}", headers=admin_headers).get_json() == updated


@pytest.mark.parametrize(
    "change", [{"name": "renamed"}, {"status": "suspended"}], ids=["name", "status"]
)
def test_patch_moves_updated_at_forward(client, admin_headers, clock, change):
    created = create_agent(client, admin_headers)
    clock.advance(3600)
    updated = client.patch(f"/v1/agents/{created['id']}", json=change, headers=admin_headers)
    assert instant(updated.get_json()["updatedAt"]) >= instant(created["updatedAt"]) + timedelta(
        seconds=3600
    )
    assert updated.get_json()["createdAt"] == created["createdAt"]


@pytest.mark.parametrize(
    ("created_with", "change"),
    [
        ({"description": "old"}, {}),
        ({"description": "old"}, {"name": "mailer"}),
        ({"description": "old"}, {"description": "old"}),
        ({}, {"description": None}),
        ({"description": ""}, {"description": ""}),
        ({"description": "old"}, {"status": "active"}),
        ({"status": "suspended"}, {"status": "suspended"}),
        ({"description": "old"}, {"name": "mailer", "description": "old", "status": "active"}),
    ],
    ids=[
        "empty-body",
        "same-name",
        "same-description",
        "null-description-again",
        "empty-description-again",
        "same-status",
        "suspended-again",
        "all-three-the-same",
    ],
)
def test_a_patch_that_changes_nothing_changes_nothing(
    client, admin_headers, clock, created_with, change
):
    body = dict(created_with)
    status = body.pop("status", None)
    created = create_agent(client, admin_headers, **body)
    if status is not None:  # an agent is created active
        path = f"/v1/agents/{created['id']}"
        created = client.patch(path, json={"status": status}, headers=admin_headers).get_json()
    clock.advance(60)
    response = client.patch(f"/v1/agents/{created['id']}", json=change, headers=admin_headers)
    assert response.status_code == 200
    assert response.get_json() == created  # updatedAt included
    assert client.get(f"/v1/agents/{created['id']}", headers=admin_headers).get_json() == created


@pytest.mark.parametrize("target", STATUSES)
@pytest.mark.parametrize("start", STATUSES)
def test_patch_moves_between_any_two_statuses(client, admin_headers, start, target):
    agent = create_agent(client, admin_headers)
    path = f"/v1/agents/{agent['id']}"
    if start != "active":
        assert client.patch(path, json={"status": start}, headers=admin_headers).status_code == 200
    response = client.patch(path, json={"status": target}, headers=admin_headers)
    assert response.status_code == 200
    assert response.get_json()["status"] == target
    assert client.get(path, headers=admin_headers).get_json()["status"] == target


def test_patch_unknown_id_is_404_agent_not_found(client, admin_headers):
    path = f"/v1/agents/{uuid.uuid4()}"
    response = client.patch(path, json={"name": "x"}, headers=admin_headers)
    assert_error(response, 404, "AGENT_NOT_FOUND")
    assert client.get("/v1/agents", headers=admin_headers).get_json()["data"] == []


def test_patch_does_not_touch_other_agents(client, admin_headers):
    first = create_agent(client, admin_headers, name="first")
    second = create_agent(client, admin_headers, name="second")
    client.patch(f"/v1/agents/{first['id']}", json={"status": "revoked"}, headers=admin_headers)
    assert client.get(f"/v1/agents/{second['id']}", headers=admin_headers).get_json() == second


# --- delete -----------------------------------------------------------------------------------


def test_delete_answers_204_without_a_body_and_the_agent_is_gone(client, admin_headers):
    agent = create_agent(client, admin_headers)
    response = client.delete(f"/v1/agents/{agent['id']}", headers=admin_headers)
    assert response.status_code == 204
    assert response.get_data() == b""
    assert_error(
        client.get(f"/v1/agents/{agent['id']}", headers=admin_headers), 404, "AGENT_NOT_FOUND"
    )
    assert client.get("/v1/agents", headers=admin_headers).get_json()["pagination"]["total"] == 0


def test_delete_twice_is_404_the_second_time(client, admin_headers):
    agent = create_agent(client, admin_headers)
    assert client.delete(f"/v1/agents/{agent['id']}", headers=admin_headers).status_code == 204
    response = client.delete(f"/v1/agents/{agent['id']}", headers=admin_headers)
    assert_error(response, 404, "AGENT_NOT_FOUND")


def test_delete_unknown_id_is_404_agent_not_found(client, admin_headers):
    keep = create_agent(client, admin_headers)
    response = client.delete(f"/v1/agents/{uuid.uuid4()}", headers=admin_headers)
    assert_error(response, 404, "AGENT_NOT_FOUND")
    assert client.get(f"/v1/agents/{keep['id']}", headers=admin_headers).status_code == 200


def test_delete_cascades_to_the_agents_policies_and_nothing_else(client, admin_headers):
    doomed = create_agent(client, admin_headers, name="doomed")
    survivor = create_agent(client, admin_headers, name="survivor")
    doomed_policies = [create_policy(client, admin_headers, doomed["id"], f"d{i}") for i in (1, 2)]
    kept_policy = create_policy(client, admin_headers, survivor["id"], "kept")

    assert client.delete(f"/v1/agents/{doomed['id']}", headers=admin_headers).status_code == 204

    for policy in doomed_policies:
        response = client.get(f"/v1/policies/{policy['id']}", headers=admin_headers)
        assert_error(response, 404, "POLICY_NOT_FOUND")
    listed = client.get(f"/v1/policies?agent_id={doomed['id']}", headers=admin_headers)
    assert listed.get_json()["data"] == []
    everything = client.get("/v1/policies", headers=admin_headers).get_json()
    assert everything["data"] == [kept_policy]
    assert client.get(f"/v1/agents/{survivor['id']}", headers=admin_headers).get_json() == survivor
