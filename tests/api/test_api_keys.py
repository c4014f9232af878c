"""``/v1/api-keys``: create (the full key shown once), list without secrets, revoke; a new key
works at once, a revoked or expired one stops working."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.api.helpers import assert_error, instant
from tests.conftest import bearer

KEY_FIELDS = {"id", "name", "prefix", "scopes", "expiresAt", "createdAt"}
KEY_FORMAT = re.compile(r"svc_[0-9a-f]{32}")


def create_key(client, headers, **body) -> Any:
    body = {"name": "ci", "scopes": ["admin"], **body}
    response = client.post("/v1/api-keys", json=body, headers=headers)
    assert response.status_code == 201, response.get_data(as_text=True)
    return response.get_json()


def listed_keys(client, headers) -> Any:
    response = client.get("/v1/api-keys", headers=headers)
    assert response.status_code == 200
    return response.get_json()["data"]


# --- create -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scopes", "expected"),
    [
        (["admin"], ["admin"]),
        (["read-only"], ["read-only"]),
        (["admin", "read-only"], ["admin", "read-only"]),
        (["read-only", "admin"], ["admin", "read-only"]),
    ],
    ids=["admin", "read-only", "both", "both-reversed"],
)
def test_create_answers_201_with_the_key_once(client, admin_headers, clock, scopes, expected):
    before = clock.moment
    body = {"name": "deploy bot", "scopes": scopes}
    response = client.post("/v1/api-keys", json=body, headers=admin_headers)
    after = clock.moment

    assert response.status_code == 201
    created = response.get_json()
    assert set(created) == KEY_FIELDS | {"key"}
    assert str(uuid.UUID(created["id"])) == created["id"]
    assert created["name"] == "deploy bot"
    assert KEY_FORMAT.fullmatch(created["key"])
    assert created["prefix"] == created["key"][:10]
    assert sorted(created["scopes"]) == expected
    assert created["expiresAt"] is None
    assert before < instant(created["createdAt"]) <= after


def test_every_key_is_different(client, admin_headers):
    made = [create_key(client, admin_headers) for _ in range(5)]
    assert len({k["key"] for k in made}) == 5
    assert len({k["id"] for k in made}) == 5


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("2027-01-01T00:00:00Z", datetime(2027, 1, 1, tzinfo=UTC)),
        ("2027-01-01T00:00:00+00:00", datetime(2027, 1, 1, tzinfo=UTC)),
        ("2027-01-01T02:30:00+02:30", datetime(2027, 1, 1, tzinfo=UTC)),
        ("2026-12-31T19:00:00-05:00", datetime(2027, 1, 1, tzinfo=UTC)),
        ("2027-01-01T00:00:00", datetime(2027, 1, 1, tzinfo=UTC)),
        ("2027-01-01T00:00:00.250000Z", datetime(2027, 1, 1, 0, 0, 0, 250000, tzinfo=UTC)),
        ("2027-01-01t00:00:00z", datetime(2027, 1, 1, tzinfo=UTC)),
        # after the end of year 9999 in UTC: the last instant there is (was 500)
        ("9999-12-31T23:00:00-05:00", datetime.max.replace(tzinfo=UTC)),
        (None, None),
    ],
    ids=[
        "utc-z",
        "utc-offset",
        "positive-offset",
        "negative-offset",
        "naive-is-utc",
        "ms",
        "rfc-3339-lower-case",
        "after-year-9999-in-utc",
        "null",
    ],
)
def test_create_keeps_the_expiry_in_utc(client, admin_headers, given, expected):
    created = create_key(client, admin_headers, expiresAt=given)
    if expected is None:
        assert created["expiresAt"] is None
    else:
        assert instant(created["expiresAt"]) == expected
    [listed] = [k for k in listed_keys(client, admin_headers) if k["id"] == created["id"]]
    assert listed["expiresAt"] == created["expiresAt"]


# --- the new key ------------------------------------------------------------------------------


def test_a_new_admin_key_works_immediately_in_the_same_workspace(client, admin_headers):
    agent = client.post("/v1/agents", json={"name": "a"}, headers=admin_headers).get_json()
    key = create_key(client, admin_headers, scopes=["admin"])["key"]

    listed = client.get("/v1/agents", headers=bearer(key))
    assert listed.status_code == 200
    assert listed.get_json()["data"] == [agent]
    created = client.post("/v1/agents", json={"name": "b"}, headers=bearer(key))
    assert created.status_code == 201
    assert client.get("/v1/agents", headers=admin_headers).get_json()["pagination"]["total"] == 2


def test_a_new_read_only_key_reads_but_cannot_write(client, admin_headers):
    agent = client.post("/v1/agents", json={"name": "a"}, headers=admin_headers).get_json()
    key = create_key(client, admin_headers, scopes=["read-only"])["key"]

    assert client.get(f"/v1/agents/{agent['id']}", headers=bearer(key)).get_json() == agent
    response = client.post("/v1/agents", json={"name": "b"}, headers=bearer(key))
    assert_error(response, 403, "INSUFFICIENT_SCOPE")
    response = client.post(
        "/v1/api-keys", json={"name": "x", "scopes": ["admin"]}, headers=bearer(key)
    )
    assert_error(response, 403, "INSUFFICIENT_SCOPE")
    assert client.get("/v1/agents", headers=admin_headers).get_json()["pagination"]["total"] == 1


def test_a_key_with_an_expiry_works_until_then_and_is_expired_after(client, admin_headers, clock):
    expires = clock.moment + timedelta(hours=1)
    key = create_key(client, admin_headers, expiresAt=expires.isoformat())["key"]

    assert client.get("/v1/agents", headers=bearer(key)).status_code == 200
    clock.advance(3600 - 5)
    assert client.get("/v1/agents", headers=bearer(key)).status_code == 200
    clock.advance(10)
    assert_error(client.get("/v1/agents", headers=bearer(key)), 401, "API_KEY_EXPIRED")
    assert client.get("/v1/agents", headers=admin_headers).status_code == 200


# --- list -------------------------------------------------------------------------------------


def test_list_shows_keys_without_the_secret(client, admin_headers):
    made = [
        create_key(client, admin_headers, name="first", scopes=["admin"]),
        create_key(client, admin_headers, name="second", scopes=["read-only"]),
    ]
    response = client.get("/v1/api-keys", headers=admin_headers)
    assert response.status_code == 200
    body = response.get_json()
    assert set(body) == {"data", "pagination"}
    by_id = {k["id"]: k for k in body["data"]}
    for created in made:
        listed = by_id[created["id"]]
        assert set(listed) == KEY_FIELDS
        assert listed == {k: v for k, v in created.items() if k != "key"}
        assert created["key"] not in response.get_data(as_text=True)
    assert body["pagination"]["total"] == len(body["data"]) == body["pagination"]["count"]


def test_list_never_returns_the_secret_of_any_key(client, workspace, admin_headers):
    minted = [workspace.key("admin"), workspace.key("read-only")]
    created = create_key(client, admin_headers)["key"]
    text = client.get("/v1/api-keys", headers=admin_headers).get_data(as_text=True)
    for key in [*minted, created, admin_headers["Authorization"].removeprefix("Bearer ")]:
        assert key not in text
        assert key[4:] not in text


def test_list_includes_the_calling_key_by_prefix(client, admin_headers):
    own_prefix = admin_headers["Authorization"].removeprefix("Bearer ")[:10]
    prefixes = [k["prefix"] for k in listed_keys(client, admin_headers)]
    assert own_prefix in prefixes


# --- revoke -----------------------------------------------------------------------------------


def test_revoke_answers_204_and_the_key_stops_working(client, admin_headers):
    doomed = create_key(client, admin_headers, name="doomed")
    kept = create_key(client, admin_headers, name="kept")
    assert client.get("/v1/agents", headers=bearer(doomed["key"])).status_code == 200

    response = client.delete(f"/v1/api-keys/{doomed['id']}", headers=admin_headers)
    assert response.status_code == 204
    assert response.get_data() == b""
    assert_error(client.get("/v1/agents", headers=bearer(doomed["key"])), 401, "UNAUTHORIZED")
    assert client.get("/v1/agents", headers=bearer(kept["key"])).status_code == 200
    assert client.get("/v1/agents", headers=admin_headers).status_code == 200


def test_revoke_unknown_id_is_404_api_key_not_found(client, admin_headers):
    kept = create_key(client, admin_headers)
    response = client.delete(f"/v1/api-keys/{uuid.uuid4()}", headers=admin_headers)
    assert_error(response, 404, "API_KEY_NOT_FOUND")
    assert client.get("/v1/agents", headers=bearer(kept["key"])).status_code == 200


def test_revoke_keeps_the_agents_and_policies_the_key_made(client, admin_headers):
    made = create_key(client, admin_headers)
    agent = client.post("/v1/agents", json={"name": "a"}, headers=bearer(made["key"])).get_json()
    assert client.delete(f"/v1/api-keys/{made['id']}", headers=admin_headers).status_code == 204
    assert client.get(f"/v1/agents/{agent['id']}", headers=admin_headers).get_json() == agent


@pytest.mark.parametrize(
    "scopes", [["admin"], ["approver"], ["read-only"], ["approver", "read-only"]]
)
def test_whoami_answers_the_callers_own_key_with_its_scopes(client, workspace, scopes):
    key = workspace.key(*scopes)
    response = client.get("/v1/whoami", headers=bearer(key))
    assert response.status_code == 200
    me = response.json
    assert me["scopes"] == sorted(scopes)
    assert me["prefix"] == key[:10]
    assert "key" not in me
    assert set(me) == {"id", "name", "prefix", "scopes", "expiresAt", "createdAt"}


def test_whoami_needs_a_valid_key(client):
    assert_error(client.get("/v1/whoami"), 401, "UNAUTHORIZED")
