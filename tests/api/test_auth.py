"""Authentication and authorization at the HTTP boundary: which scope may call which endpoint,
what a missing, malformed, unknown, revoked or expired key gets, how workspaces are walled off
from each other, and the rate-limit headers every authenticated response carries."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from tests.api.helpers import assert_error
from tests.conftest import bearer

ALLOW_ALL = [{"type": "tool_allowlist", "tools": ["*"]}]


@dataclass
class World:
    """One agent, one policy and one spare API key, made through the API."""

    agent: dict[str, Any]
    policy: dict[str, Any]
    key: dict[str, Any]

    @property
    def ids(self) -> dict[str, str]:
        return {"agent": self.agent["id"], "policy": self.policy["id"], "key": self.key["id"]}


def build_world(client, headers) -> World:
    agent = client.post("/v1/agents", json={"name": "agent"}, headers=headers)
    assert agent.status_code == 201
    body = {"agent_id": agent.get_json()["id"], "name": "policy", "rules": ALLOW_ALL}
    policy = client.post("/v1/policies", json=body, headers=headers)
    assert policy.status_code == 201
    key = client.post("/v1/api-keys", json={"name": "spare", "scopes": ["admin"]}, headers=headers)
    assert key.status_code == 201
    return World(agent.get_json(), policy.get_json(), key.get_json())


@pytest.fixture
def world(client, admin_headers) -> World:
    return build_world(client, admin_headers)


def snapshot(client, headers) -> dict[str, Any]:
    """Everything a workspace holds, as its admin sees it."""
    return {
        noun: client.get(f"/v1/{noun}", headers=headers).get_json()
        for noun in ("agents", "policies", "api-keys")
    }


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str  # with {agent}, {policy}, {key} placeholders
    admin_only: bool
    ok: int
    body: Callable[[dict[str, str]], dict[str, Any]] | None = None

    def call(self, client, ids: dict[str, str], headers: dict[str, str], **kwargs: Any):
        path = self.path.format(**ids)
        if self.body is not None and "json" not in kwargs and "data" not in kwargs:
            kwargs["json"] = self.body(ids)
        return client.open(path, method=self.method, headers=headers, **kwargs)


ENDPOINTS = {
    "create-agent": Endpoint("POST", "/v1/agents", True, 201, lambda ids: {"name": "new"}),
    "list-agents": Endpoint("GET", "/v1/agents", False, 200),
    "get-agent": Endpoint("GET", "/v1/agents/{agent}", False, 200),
    "patch-agent": Endpoint(
        "PATCH", "/v1/agents/{agent}", True, 200, lambda ids: {"status": "suspended"}
    ),
    "delete-agent": Endpoint("DELETE", "/v1/agents/{agent}", True, 204),
    "create-policy": Endpoint(
        "POST",
        "/v1/policies",
        True,
        201,
        lambda ids: {"agent_id": ids["agent"], "name": "new", "rules": ALLOW_ALL},
    ),
    "list-policies": Endpoint("GET", "/v1/policies", False, 200),
    "list-policies-by-agent": Endpoint("GET", "/v1/policies?agent_id={agent}", False, 200),
    "get-policy": Endpoint("GET", "/v1/policies/{policy}", False, 200),
    "patch-policy": Endpoint(
        "PATCH", "/v1/policies/{policy}", True, 200, lambda ids: {"enabled": False}
    ),
    "delete-policy": Endpoint("DELETE", "/v1/policies/{policy}", True, 204),
    "create-api-key": Endpoint(
        "POST", "/v1/api-keys", True, 201, lambda ids: {"name": "k", "scopes": ["read-only"]}
    ),
    "list-api-keys": Endpoint("GET", "/v1/api-keys", True, 200),
    "revoke-api-key": Endpoint("DELETE", "/v1/api-keys/{key}", True, 204),
}
endpoints = pytest.mark.parametrize("endpoint", ENDPOINTS.values(), ids=ENDPOINTS.keys())


# --- scopes -----------------------------------------------------------------------------------


@endpoints
@pytest.mark.parametrize("scopes", [("admin",), ("admin", "read-only")], ids=["admin", "both"])
def test_an_admin_key_may_call_every_endpoint(client, workspace, world, endpoint, scopes):
    response = endpoint.call(client, world.ids, workspace.headers(*scopes))
    assert response.status_code == endpoint.ok, response.get_data(as_text=True)


@endpoints
def test_a_read_only_key_may_read_and_nothing_else(
    client, world, admin_headers, readonly_headers, endpoint
):
    before = snapshot(client, admin_headers)
    response = endpoint.call(client, world.ids, readonly_headers)
    if endpoint.admin_only:
        assert_error(response, 403, "INSUFFICIENT_SCOPE")
        assert snapshot(client, admin_headers) == before
    else:
        assert response.status_code == endpoint.ok


@pytest.mark.parametrize(
    "endpoint",
    [e for e in ENDPOINTS.values() if e.admin_only and e.body is not None],
    ids=[k for k, e in ENDPOINTS.items() if e.admin_only and e.body is not None],
)
def test_scope_is_refused_before_the_body_is_looked_at(
    client, world, admin_headers, readonly_headers, endpoint
):
    before = snapshot(client, admin_headers)
    response = endpoint.call(client, world.ids, readonly_headers, json={"bogus": 1})
    assert_error(response, 403, "INSUFFICIENT_SCOPE")
    assert snapshot(client, admin_headers) == before


@pytest.mark.parametrize(
    "path",
    [
        "/v1/agents/{}".format("00000000-0000-4000-8000-000000000000"),
        "/v1/policies/{}".format("00000000-0000-4000-8000-000000000000"),
        "/v1/api-keys/{}".format("00000000-0000-4000-8000-000000000000"),
    ],
    ids=["agent", "policy", "api-key"],
)
def test_read_only_delete_of_an_unknown_id_is_403_not_404(client, readonly_headers, path):
    assert_error(client.delete(path, headers=readonly_headers), 403, "INSUFFICIENT_SCOPE")


def test_read_only_cannot_list_api_keys(client, readonly_headers, admin_headers):
    assert_error(client.get("/v1/api-keys", headers=readonly_headers), 403, "INSUFFICIENT_SCOPE")
    assert client.get("/v1/api-keys", headers=admin_headers).status_code == 200


# --- 401 --------------------------------------------------------------------------------------


def _revoked(client, workspace, admin_headers) -> dict[str, str]:
    made = client.post(
        "/v1/api-keys", json={"name": "gone", "scopes": ["admin"]}, headers=admin_headers
    ).get_json()
    assert client.delete(f"/v1/api-keys/{made['id']}", headers=admin_headers).status_code == 204
    return bearer(made["key"])


def _valid(workspace) -> str:
    return str(workspace.key("admin"))


#: ways to not present a usable key; each takes (client, workspace, admin_headers)
BAD_AUTH: dict[str, Callable[..., dict[str, str]]] = {
    "missing": lambda c, w, a: {},
    "empty-header": lambda c, w, a: {"Authorization": ""},
    "scheme-only": lambda c, w, a: {"Authorization": "Bearer"},
    "scheme-and-space": lambda c, w, a: {"Authorization": "Bearer "},
    "no-scheme": lambda c, w, a: {"Authorization": _valid(w)},
    "basic-scheme": lambda c, w, a: {"Authorization": "Basic " + _valid(w)},
    "token-scheme": lambda c, w, a: {"Authorization": "Token " + _valid(w)},
    "x-api-key-header": lambda c, w, a: {"X-Api-Key": _valid(w)},
    "wrong-marker": lambda c, w, a: bearer("sk_" + secrets.token_hex(16)),
    "no-marker": lambda c, w, a: bearer(secrets.token_hex(16)),
    "31-hex": lambda c, w, a: bearer("svc_" + secrets.token_hex(16)[:31]),
    "33-hex": lambda c, w, a: bearer("svc_" + secrets.token_hex(17)[:33]),
    "not-hex": lambda c, w, a: bearer("svc_" + "g" * 32),
    "upper-case-hex": lambda c, w, a: bearer("svc_" + _valid(w)[4:].upper()),
    "trailing-garbage": lambda c, w, a: bearer(_valid(w) + " x"),
    "two-keys": lambda c, w, a: bearer(_valid(w) + "," + _valid(w)),
    "unknown": lambda c, w, a: bearer("svc_" + secrets.token_hex(16)),
    "revoked": _revoked,
}


@pytest.mark.parametrize("make", BAD_AUTH.values(), ids=BAD_AUTH.keys())
@pytest.mark.parametrize(
    "endpoint", [ENDPOINTS["list-agents"], ENDPOINTS["create-agent"]], ids=["read", "write"]
)
def test_no_usable_key_is_401_unauthorized(client, workspace, admin_headers, world, make, endpoint):
    response = endpoint.call(client, world.ids, make(client, workspace, admin_headers))
    assert_error(response, 401, "UNAUTHORIZED")
    assert "X-RateLimit-Remaining" not in response.headers
    assert snapshot(client, admin_headers)["agents"]["data"] == [world.agent]


@pytest.mark.parametrize("name", ["api_key", "key", "token", "access_token"])
def test_a_key_in_the_query_string_is_not_accepted(client, workspace, name):
    response = client.get("/v1/agents", query_string={name: workspace.key("admin")})
    assert_error(response, 401, "UNAUTHORIZED")


@endpoints
@pytest.mark.parametrize("kind", ["missing", "unknown", "revoked"])
def test_every_endpoint_refuses_without_a_valid_key(
    client, workspace, admin_headers, world, endpoint, kind
):
    headers = BAD_AUTH[kind](client, workspace, admin_headers)
    before = snapshot(client, admin_headers)
    response = endpoint.call(client, world.ids, headers)
    assert_error(response, 401, "UNAUTHORIZED")
    assert snapshot(client, admin_headers) == before


@endpoints
@pytest.mark.parametrize("scope", ["admin", "read-only"])
def test_every_endpoint_refuses_an_expired_key(
    client, workspace, admin_headers, world, clock, endpoint, scope
):
    expired = workspace.headers(scope, expires_at=clock.moment - timedelta(seconds=1))
    before = snapshot(client, admin_headers)
    response = endpoint.call(client, world.ids, expired)
    assert_error(response, 401, "API_KEY_EXPIRED")
    assert snapshot(client, admin_headers) == before


def test_a_key_expires_when_the_clock_passes_its_expiry(client, workspace, clock):
    headers = workspace.headers("admin", expires_at=clock.moment + timedelta(minutes=10))
    assert client.get("/v1/agents", headers=headers).status_code == 200
    clock.advance(9 * 60)
    assert client.get("/v1/agents", headers=headers).status_code == 200
    clock.advance(2 * 60)
    assert_error(client.get("/v1/agents", headers=headers), 401, "API_KEY_EXPIRED")


def test_a_revoked_expired_key_is_not_reported_as_usable(client, workspace, admin_headers, clock):
    key = workspace.key("admin", expires_at=clock.moment + timedelta(minutes=1))
    [row] = [
        k
        for k in client.get("/v1/api-keys", headers=admin_headers).get_json()["data"]
        if k["prefix"] == key[:10]
    ]
    assert client.delete(f"/v1/api-keys/{row['id']}", headers=admin_headers).status_code == 204
    clock.advance(120)
    response = client.get("/v1/agents", headers=bearer(key))
    assert response.status_code == 401
    assert response.get_json()["error"]["code"] in {"UNAUTHORIZED", "API_KEY_EXPIRED"}


def test_a_key_may_revoke_itself_and_is_refused_from_the_next_request(client, admin_headers):
    own_prefix = admin_headers["Authorization"].removeprefix("Bearer ")[:10]
    keys = client.get("/v1/api-keys", headers=admin_headers).get_json()["data"]
    [own] = [k for k in keys if k["prefix"] == own_prefix]

    response = client.delete(f"/v1/api-keys/{own['id']}", headers=admin_headers)
    assert response.status_code == 204
    assert_error(client.get("/v1/agents", headers=admin_headers), 401, "UNAUTHORIZED")
    response = client.delete(f"/v1/api-keys/{own['id']}", headers=admin_headers)
    assert_error(response, 401, "UNAUTHORIZED")


# --- workspaces -------------------------------------------------------------------------------


@pytest.fixture
def foreign(client, other_workspace) -> tuple[World, dict[str, str]]:
    """A world in the other workspace, and that workspace's admin headers."""
    headers = other_workspace.headers("admin")
    return build_world(client, headers), headers


FOREIGN_ACCESS = {
    name: (endpoint, code)
    for name, endpoint, code in [
        ("get-agent", ENDPOINTS["get-agent"], "AGENT_NOT_FOUND"),
        ("patch-agent", ENDPOINTS["patch-agent"], "AGENT_NOT_FOUND"),
        ("delete-agent", ENDPOINTS["delete-agent"], "AGENT_NOT_FOUND"),
        ("get-policy", ENDPOINTS["get-policy"], "POLICY_NOT_FOUND"),
        ("patch-policy", ENDPOINTS["patch-policy"], "POLICY_NOT_FOUND"),
        ("delete-policy", ENDPOINTS["delete-policy"], "POLICY_NOT_FOUND"),
        ("revoke-api-key", ENDPOINTS["revoke-api-key"], "API_KEY_NOT_FOUND"),
    ]
}


@pytest.mark.parametrize(("endpoint", "code"), FOREIGN_ACCESS.values(), ids=FOREIGN_ACCESS.keys())
def test_another_workspaces_objects_do_not_exist(client, admin_headers, foreign, endpoint, code):
    theirs, their_headers = foreign
    before = snapshot(client, their_headers)
    response = endpoint.call(client, theirs.ids, admin_headers)
    assert_error(response, 404, code)
    assert snapshot(client, their_headers) == before
    assert client.get("/v1/agents", headers=bearer(theirs.key["key"])).status_code == 200


def test_lists_show_only_the_callers_workspace(client, admin_headers, world, foreign):
    theirs, their_headers = foreign
    ours = snapshot(client, admin_headers)
    assert ours["agents"]["data"] == [world.agent]
    assert ours["policies"]["data"] == [world.policy]
    our_key_ids = {k["id"] for k in ours["api-keys"]["data"]}
    their_key_ids = {k["id"] for k in snapshot(client, their_headers)["api-keys"]["data"]}
    assert world.key["id"] in our_key_ids
    assert theirs.key["id"] in their_key_ids
    assert not our_key_ids & their_key_ids


def test_policy_filter_by_another_workspaces_agent_is_empty(client, admin_headers, foreign):
    theirs, _ = foreign
    response = client.get(f"/v1/policies?agent_id={theirs.agent['id']}", headers=admin_headers)
    assert response.status_code == 200
    assert response.get_json()["data"] == []
    assert response.get_json()["pagination"]["total"] == 0


def test_policy_for_another_workspaces_agent_is_404_agent_not_found(
    client, admin_headers, world, foreign
):
    theirs, their_headers = foreign
    ours_before, theirs_before = snapshot(client, admin_headers), snapshot(client, their_headers)
    body = {"agent_id": theirs.agent["id"], "name": "sneaky", "rules": ALLOW_ALL}
    response = client.post("/v1/policies", json=body, headers=admin_headers)
    assert_error(response, 404, "AGENT_NOT_FOUND")
    assert snapshot(client, admin_headers) == ours_before
    assert snapshot(client, their_headers) == theirs_before


def test_a_key_made_in_one_workspace_sees_only_that_workspace(
    client, admin_headers, world, foreign
):
    theirs, their_headers = foreign
    made = client.post(
        "/v1/api-keys", json={"name": "k", "scopes": ["read-only"]}, headers=their_headers
    ).get_json()
    listed = client.get("/v1/agents", headers=bearer(made["key"])).get_json()
    assert listed["data"] == [theirs.agent]
    response = client.get(f"/v1/agents/{world.agent['id']}", headers=bearer(made["key"]))
    assert_error(response, 404, "AGENT_NOT_FOUND")


# --- rate-limit headers -----------------------------------------------------------------------

UNKNOWN = str(uuid.UUID(int=0x1234))

RESPONSES = {
    "200-list": ("GET", "/v1/agents", None, "admin", 200),
    "200-get": ("GET", "/v1/agents/{agent}", None, "read-only", 200),
    "201-create": ("POST", "/v1/agents", {"name": "n"}, "admin", 201),
    "204-delete": ("DELETE", "/v1/policies/{policy}", None, "admin", 204),
    "400-validation": ("POST", "/v1/agents", {"name": ""}, "admin", 400),
    "400-query": ("GET", "/v1/agents?limit=0", None, "read-only", 400),
    "403-scope": ("POST", "/v1/agents", {"name": "n"}, "read-only", 403),
    "404-agent": ("GET", f"/v1/agents/{UNKNOWN}", None, "admin", 404),
    "404-policy": ("PATCH", f"/v1/policies/{UNKNOWN}", {"name": "n"}, "admin", 404),
    "404-api-key": ("DELETE", f"/v1/api-keys/{UNKNOWN}", None, "admin", 404),
}


@pytest.mark.parametrize(
    ("method", "path", "body", "scope", "status"), RESPONSES.values(), ids=RESPONSES.keys()
)
def test_authenticated_responses_carry_rate_limit_headers(
    client, workspace, world, settings, clock, method, path, body, scope, status
):
    headers = workspace.headers(scope)
    response = client.open(path.format(**world.ids), method=method, json=body, headers=headers)
    assert response.status_code == status
    limit = settings.rate_limit_per_minute
    assert response.headers["X-RateLimit-Limit"] == str(limit)
    assert response.headers["X-RateLimit-Remaining"] == str(limit - 1)  # a fresh key
    assert response.headers["X-RateLimit-Reset"] == str(
        (int(clock.moment.timestamp()) // 60 + 1) * 60
    )


def test_remaining_counts_down_per_key_whatever_the_outcome(client, workspace):
    headers = workspace.headers("read-only")
    seen = [
        client.get("/v1/agents", headers=headers),
        client.post("/v1/agents", json={"name": "n"}, headers=headers),  # 403
        client.get(f"/v1/agents/{UNKNOWN}", headers=headers),  # 404
        client.get("/v1/agents", headers=headers),
    ]
    remaining = [int(r.headers["X-RateLimit-Remaining"]) for r in seen]
    assert remaining == [remaining[0] - i for i in range(4)]
