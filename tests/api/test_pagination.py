"""Offset pagination of ``/v1/agents``, ``/v1/policies`` and ``/v1/api-keys``: the envelope, the
edges of ``limit`` and ``offset``, and walking every page."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from core.store import agents, policies

ALLOW_ALL = [{"type": "tool_allowlist", "tools": ["*"]}]


def page(client, headers, path: str, **query: Any) -> Any:
    response = client.get(path, query_string=query, headers=headers)
    assert response.status_code == 200, response.get_data(as_text=True)
    body = response.get_json()
    assert set(body) == {"data", "pagination"}
    assert set(body["pagination"]) == {"limit", "offset", "count", "total"}
    assert body["pagination"]["count"] == len(body["data"])
    return body


def bulk(app, workspace, clock, noun: str, n: int) -> None:
    """``n`` agents (or ``n`` policies of one agent) written straight to the database: the
    API's create path is tested elsewhere, and 200 requests would only slow the suite."""
    db = app.extensions["agentauth"].db
    with db.transaction(write=True) as session:
        agent = agents.create_agent(session, workspace.id, {"name": "owner"}, clock())
        for i in range(n - 1 if noun == "agents" else n):
            if noun == "agents":
                agents.create_agent(session, workspace.id, {"name": f"a{i}"}, clock())
            else:
                body = {"agent_id": agent.id, "name": f"p{i}", "rules": ALLOW_ALL}
                policies.create_policy(session, workspace.id, body, clock())


def make_agents(client, headers, n: int) -> list[str]:
    return [
        client.post("/v1/agents", json={"name": f"a{i}"}, headers=headers).get_json()["id"]
        for i in range(n)
    ]


def make_policies(client, headers, n: int) -> list[str]:
    agent = client.post("/v1/agents", json={"name": "owner"}, headers=headers).get_json()
    body = {"agent_id": agent["id"], "rules": ALLOW_ALL}
    return [
        client.post("/v1/policies", json={**body, "name": f"p{i}"}, headers=headers).get_json()[
            "id"
        ]
        for i in range(n)
    ]


def make_keys(client, headers, n: int) -> list[str]:
    """``n`` keys in all: the caller's own key is one of them."""
    own = [k["id"] for k in client.get("/v1/api-keys", headers=headers).get_json()["data"]]
    body = {"name": "k", "scopes": ["read-only"]}
    made = [
        client.post("/v1/api-keys", json=body, headers=headers).get_json()["id"]
        for _ in range(n - len(own))
    ]
    return own + made


LISTS: dict[str, tuple[str, Callable[..., list[str]]]] = {
    "agents": ("/v1/agents", make_agents),
    "policies": ("/v1/policies", make_policies),
    "api-keys": ("/v1/api-keys", make_keys),
}
lists = pytest.mark.parametrize(("path", "make"), LISTS.values(), ids=LISTS.keys())


@lists
def test_limit_1_walks_every_item_exactly_once(client, admin_headers, path, make):
    made = make(client, admin_headers, 5)
    seen: list[str] = []
    for offset in range(7):
        body = page(client, admin_headers, path, limit=1, offset=offset)
        assert body["pagination"] == {
            "limit": 1,
            "offset": offset,
            "count": 1 if offset < 5 else 0,
            "total": 5,
        }
        seen += [item["id"] for item in body["data"]]
    assert sorted(seen) == sorted(made)
    assert len(seen) == len(set(seen)) == 5


@lists
@pytest.mark.parametrize("limit", [1, 2, 3, 4, 5, 6])
def test_pages_of_any_size_join_up_to_the_full_list(client, admin_headers, path, make, limit):
    make(client, admin_headers, 5)
    full = [item["id"] for item in page(client, admin_headers, path)["data"]]
    walked: list[str] = []
    for offset in range(0, 5, limit):
        walked += [
            item["id"]
            for item in page(client, admin_headers, path, limit=limit, offset=offset)["data"]
        ]
    assert walked == full


@lists
@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({}, {"limit": 100, "offset": 0, "count": 3, "total": 3}),
        ({"limit": 2}, {"limit": 2, "offset": 0, "count": 2, "total": 3}),
        ({"offset": 2}, {"limit": 100, "offset": 2, "count": 1, "total": 3}),
        ({"limit": 2, "offset": 2}, {"limit": 2, "offset": 2, "count": 1, "total": 3}),
        ({"offset": 3}, {"limit": 100, "offset": 3, "count": 0, "total": 3}),
        ({"offset": 1000}, {"limit": 100, "offset": 1000, "count": 0, "total": 3}),
        ({"limit": 200}, {"limit": 200, "offset": 0, "count": 3, "total": 3}),
        ({"limit": "007", "offset": "01"}, {"limit": 7, "offset": 1, "count": 2, "total": 3}),
    ],
    ids=[
        "defaults",
        "limit",
        "offset",
        "both",
        "offset-at-end",
        "offset-far-past-end",
        "limit-200",
        "leading-zeros",
    ],
)
def test_envelope_reports_limit_offset_count_total(
    client, admin_headers, path, make, query, expected
):
    made = make(client, admin_headers, 3)
    body = page(client, admin_headers, path, **query)
    assert body["pagination"] == expected
    if expected["count"]:
        assert {item["id"] for item in body["data"]} <= set(made)
    else:
        assert body["data"] == []


@lists
def test_pages_are_stable_and_do_not_overlap(client, admin_headers, path, make):
    make(client, admin_headers, 4)
    first = page(client, admin_headers, path, limit=2, offset=0)["data"]
    second = page(client, admin_headers, path, limit=2, offset=2)["data"]
    assert not {i["id"] for i in first} & {i["id"] for i in second}
    assert page(client, admin_headers, path, limit=2, offset=0)["data"] == first
    assert page(client, admin_headers, path, limit=4)["data"] == first + second


def test_policy_filter_pages_count_only_the_agents_policies(client, admin_headers):
    mine = make_policies(client, admin_headers, 3)
    make_policies(client, admin_headers, 2)  # another agent's
    agent_id = client.get(f"/v1/policies/{mine[0]}", headers=admin_headers).get_json()["agentId"]
    seen = []
    for offset in range(4):
        body = page(
            client, admin_headers, "/v1/policies", agent_id=agent_id, limit=1, offset=offset
        )
        assert body["pagination"]["total"] == 3
        seen += [p["id"] for p in body["data"]]
    assert sorted(seen) == sorted(mine)


@pytest.mark.parametrize(
    ("noun", "path"),
    [("agents", "/v1/agents"), ("policies", "/v1/policies")],
)
def test_default_limit_is_100_and_max_is_200(
    app, client, workspace, admin_headers, clock, noun, path
):
    bulk(app, workspace, clock, noun, 201)

    default = page(client, admin_headers, path)
    assert default["pagination"] == {"limit": 100, "offset": 0, "count": 100, "total": 201}

    largest = page(client, admin_headers, path, limit=200)
    assert largest["pagination"] == {"limit": 200, "offset": 0, "count": 200, "total": 201}
    assert [i["id"] for i in largest["data"][:100]] == [i["id"] for i in default["data"]]

    rest = page(client, admin_headers, path, limit=200, offset=200)
    assert rest["pagination"]["count"] == 1
    ids = [i["id"] for i in largest["data"] + rest["data"]]
    assert len(set(ids)) == 201

    response = client.get(f"{path}?limit=201", headers=admin_headers)
    assert response.status_code == 400
    assert response.get_json()["error"]["code"] == "VALIDATION_ERROR"
