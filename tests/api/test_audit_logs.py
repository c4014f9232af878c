"""``GET /v1/audit-logs``: filters, validation, order and paging, the envelope, entry fields,
scopes, workspace isolation, and the cascade of deleting an agent."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from core.domain.clock import isoformat
from core.domain.redaction import MASK
from tests.api.helpers import decide, make_agent, record_audit_entries

ALLOW_CALENDAR = [{"type": "tool_allowlist", "tools": ["calendar.*"]}]
ENTRY_FIELDS = {
    "id",
    "agentId",
    "action",
    "toolName",
    "parameters",
    "result",
    "policyId",
    "reason",
    "latencyMs",
    "timestamp",
}


def logs(client, headers, **query: Any) -> dict[str, Any]:
    response = client.get("/v1/audit-logs", query_string=query, headers=headers)
    assert response.status_code == 200, response.get_data(as_text=True)
    return dict(response.json)


def ids_of(body: dict[str, Any]) -> list[str]:
    return [entry["id"] for entry in body["data"]]


def parse_ts(text: str) -> datetime:
    return datetime.fromisoformat(text)


# ---------------------------------------------------------------------------------------------
# Filters


@pytest.fixture
def history(client, admin_headers, clock) -> dict[str, Any]:
    """Five decisions an hour apart, labelled; `at` holds each one's instant."""
    a = make_agent(client, admin_headers, "a", ALLOW_CALENDAR)
    b = make_agent(client, admin_headers, "b")
    labels: dict[str, str] = {}
    at: dict[str, datetime] = {}
    for label, agent, tool in [
        ("a-read", a, "calendar.read"),  # allowed
        ("a-email", a, "email.send"),  # denied, default deny
        ("b-read", b, "calendar.read"),  # denied, no policy
        ("a-write", a, "calendar.write"),  # allowed
        ("b-email", b, "email.send"),  # denied
    ]:
        clock.advance(3600)
        labels[decide(client, admin_headers, agent, tool)["auditId"]] = label
        at[label] = clock.moment  # one clock reading per request
    return {"a": a, "b": b, "labels": labels, "at": at}


def labelled(history: dict[str, Any], body: dict[str, Any]) -> list[str]:
    return [history["labels"][i] for i in ids_of(body)]


ALL_NEWEST_FIRST = ["b-email", "a-write", "b-read", "a-email", "a-read"]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        pytest.param({}, ALL_NEWEST_FIRST, id="none"),
        pytest.param({"agent_id": "a"}, ["a-write", "a-email", "a-read"], id="agent-a"),
        pytest.param({"agent_id": "b"}, ["b-email", "b-read"], id="agent-b"),
        pytest.param({"action": "authorize"}, ALL_NEWEST_FIRST, id="action-authorize"),
        pytest.param({"action": "export"}, [], id="action-other"),
        pytest.param({"tool_name": "calendar.read"}, ["b-read", "a-read"], id="tool-exact"),
        pytest.param({"tool_name": "calendar.*"}, [], id="tool-no-glob"),
        pytest.param({"tool_name": "calendar"}, [], id="tool-no-prefix"),
        pytest.param({"tool_name": "Calendar.read"}, [], id="tool-case-sensitive"),
        pytest.param({"tool_name": "calendar.rea"}, [], id="tool-no-substring"),
        pytest.param({"result": "allowed"}, ["a-write", "a-read"], id="result-allowed"),
        pytest.param({"result": "denied"}, ["b-email", "b-read", "a-email"], id="result-denied"),
        pytest.param({"result": "escalated"}, [], id="result-escalated"),
        pytest.param({"agent_id": "a", "result": "denied"}, ["a-email"], id="agent-and-result"),
        pytest.param(
            {"tool_name": "email.send", "agent_id": "b", "result": "denied"},
            ["b-email"],
            id="three-filters",
        ),
        pytest.param({"from": ("b-read", 0)}, ["b-email", "a-write", "b-read"], id="from-incl"),
        pytest.param({"to": ("b-read", 0)}, ["b-read", "a-email", "a-read"], id="to-inclusive"),
        pytest.param(
            {"from": ("a-email", 0), "to": ("a-write", 0)},
            ["a-write", "b-read", "a-email"],
            id="between",
        ),
        pytest.param({"from": ("b-read", 0), "to": ("b-read", 0)}, ["b-read"], id="from-is-to"),
        pytest.param({"from": ("b-read", 1)}, ["b-email", "a-write"], id="from-1us-after"),
        pytest.param({"to": ("b-read", -1)}, ["a-email", "a-read"], id="to-1us-before"),
        pytest.param({"from": ("b-email", 1)}, [], id="from-after-all"),
        pytest.param({"to": ("a-read", -1)}, [], id="to-before-all"),
        pytest.param({"from": ("a-write", 0), "agent_id": "a"}, ["a-write"], id="from-and-agent"),
    ],
)
def test_filter(client, admin_headers, history, query, expected):
    resolved: dict[str, str] = {}
    for name, value in query.items():
        if name == "agent_id":
            resolved[name] = history[value]
        elif name in ("from", "to"):
            label, shift = value  # an entry's instant, moved by `shift` microseconds
            resolved[name] = isoformat(history["at"][label] + timedelta(microseconds=shift))
        else:
            resolved[name] = value
    body = logs(client, admin_headers, **resolved)
    assert labelled(history, body) == expected
    assert body["pagination"]["total"] == len(expected)


@pytest.mark.parametrize(
    "spelling",
    [
        pytest.param(lambda m: isoformat(m), id="utc-z"),
        pytest.param(lambda m: m.isoformat(), id="utc-offset"),
        pytest.param(
            lambda m: m.astimezone(timezone(timedelta(hours=2))).isoformat(), id="plus-two"
        ),
    ],
)
def test_from_and_to_accept_any_iso_8601_offset(client, admin_headers, history, spelling):
    moment = history["at"]["b-read"]
    body = logs(client, admin_headers, **{"from": spelling(moment), "to": spelling(moment)})
    assert labelled(history, body) == ["b-read"]


def test_from_and_to_take_rfc_3339_lower_case_t_and_z(client, admin_headers, history):
    moment = isoformat(history["at"]["b-read"]).replace("T", "t").replace("Z", "z")
    body = logs(client, admin_headers, **{"from": moment, "to": moment})
    assert labelled(history, body) == ["b-read"]


def test_from_and_to_take_instants_beyond_the_years_1_to_9999_in_utc(
    client, admin_headers, history
):
    """Valid date-times whose instant is before year 1 or after year 9999 in UTC (were 500)."""
    every = logs(client, admin_headers)
    query = {"from": "0001-01-01T00:00:00+01:00", "to": "9999-12-31T23:00:00-05:00"}
    assert logs(client, admin_headers, **query) == every
    assert logs(client, admin_headers, to=query["from"])["data"] == []
    assert logs(client, admin_headers, **{"from": query["to"]})["data"] == []


def test_unknown_but_well_formed_agent_id_gives_empty_list(client, admin_headers, history):
    body = logs(client, admin_headers, agent_id="00000000-0000-4000-8000-000000000000")
    assert body["data"] == []
    assert body["pagination"]["total"] == 0


def test_agent_id_filter_ignores_case(client, admin_headers, history):
    body = logs(client, admin_headers, agent_id=history["a"].upper())
    assert labelled(history, body) == ["a-write", "a-email", "a-read"]


# ---------------------------------------------------------------------------------------------
# Validation


@pytest.mark.parametrize(
    "query",
    [
        pytest.param({"agent_id": "not-a-uuid"}, id="agent-id-malformed"),
        pytest.param({"agent_id": ""}, id="agent-id-empty"),
        pytest.param({"result": "maybe"}, id="result-maybe"),
        pytest.param({"result": "ALLOWED"}, id="result-uppercase"),
        pytest.param({"from": "notadate"}, id="from-notadate"),
        pytest.param({"to": "notadate"}, id="to-notadate"),
        pytest.param({"from": "2026-13-01T00:00:00Z"}, id="from-month-13"),
        # no stored text holds a NUL; PostgreSQL refused the query outright (was 500 there)
        pytest.param({"action": "authorize\x00"}, id="action-nul"),
        pytest.param({"tool_name": "\x00"}, id="tool-name-nul"),
        pytest.param({"limit": "0"}, id="limit-0"),
        pytest.param({"limit": "1001"}, id="limit-1001"),
        pytest.param({"limit": "-1"}, id="limit-negative"),
        pytest.param({"limit": "ten"}, id="limit-word"),
        pytest.param({"offset": "-1"}, id="offset-negative"),
        pytest.param({"unknown": "1"}, id="unknown-parameter"),
        pytest.param({"result": ["allowed", "denied"]}, id="repeated-parameter"),
        pytest.param({"agentId": "00000000-0000-4000-8000-000000000000"}, id="camel-case-name"),
    ],
)
def test_invalid_query_is_400(client, admin_headers, query):
    response = client.get("/v1/audit-logs", query_string=query, headers=admin_headers)
    assert response.status_code == 400
    assert response.json["error"]["code"] == "VALIDATION_ERROR"


@pytest.mark.parametrize("limit", [1, 1000], ids=["limit-1", "limit-1000"])
def test_limit_bounds_are_accepted(client, admin_headers, limit):
    body = logs(client, admin_headers, limit=limit)
    assert body["pagination"]["limit"] == limit


# ---------------------------------------------------------------------------------------------
# Order, paging, envelope


@pytest.fixture
def tied_history(app, client, admin_headers, workspace, clock) -> list[str]:
    """Entries through the API plus entries appended with identical timestamps (ties)."""
    agent = make_agent(client, admin_headers, "a", ALLOW_CALENDAR)
    for tool in ("calendar.read", "email.send", "calendar.write"):
        decide(client, admin_headers, agent, tool)
    clock.advance(60)
    tie = clock()
    record_audit_entries(
        app,
        (
            {
                "workspace_id": workspace.id,
                "agent_id": agent,
                "agent_exists": True,
                "key_id": None,
                "tool_name": f"tied.{i}",
                "parameters": {"i": i},
                "result": "denied",
                "policy_id": None,
                "rule_index": None,
                "reason": "tie",
                "latency_ms": 0.0,
                "timestamp": tie,
            }
            for i in range(6)
        ),
    )
    clock.advance(60)
    decide(client, admin_headers, agent, "calendar.read")
    return [agent]


def assert_newest_first(entries: list[dict[str, Any]]) -> None:
    for newer, older in itertools.pairwise(entries):
        assert parse_ts(newer["timestamp"]) >= parse_ts(older["timestamp"])
        if newer["timestamp"] == older["timestamp"]:
            assert newer["id"] > older["id"], "ties must be broken by id, descending"


def test_newest_first_with_ties_by_id_descending(client, admin_headers, tied_history):
    entries = logs(client, admin_headers, limit=1000)["data"]
    assert len(entries) == 10
    assert_newest_first(entries)
    tied = [e for e in entries if e["toolName"].startswith("tied.")]
    assert [e["id"] for e in tied] == sorted((e["id"] for e in tied), reverse=True)
    assert entries[0]["toolName"] == "calendar.read"  # the last decision
    assert entries[-1]["toolName"] == "calendar.read"  # the first decision


@pytest.mark.parametrize("page_size", [1, 3, 4], ids=["limit-1", "limit-3", "limit-4"])
def test_paging_is_stable_and_matches_one_page(client, admin_headers, tied_history, page_size):
    everything = ids_of(logs(client, admin_headers, limit=1000))
    walked: list[str] = []
    offset = 0
    while True:
        body = logs(client, admin_headers, limit=page_size, offset=offset)
        assert body["pagination"]["total"] == len(everything)
        if not body["data"]:
            break
        walked += ids_of(body)
        offset += page_size
    assert walked == everything
    again = [ids_of(logs(client, admin_headers, limit=1, offset=i))[0] for i in range(10)]
    assert again == everything


def test_envelope(client, admin_headers, history):
    body = logs(client, admin_headers, limit=2, offset=1)
    assert set(body) == {"data", "pagination"}
    following = body["pagination"].pop("nextCursor")
    assert body["pagination"] == {"limit": 2, "offset": 1, "count": 2, "total": 5}
    assert labelled(history, body) == ["a-write", "b-read"]
    # the page after it, by its cursor, is the one at offset 3
    after = logs(client, admin_headers, limit=2, cursor=following)
    assert ids_of(after) == ids_of(logs(client, admin_headers, limit=2, offset=3))


def test_envelope_defaults_and_offset_past_end(client, admin_headers, history):
    assert logs(client, admin_headers)["pagination"] == {
        "limit": 100,
        "offset": 0,
        "count": 5,
        "total": 5,
        "nextCursor": None,
    }
    past = logs(client, admin_headers, offset=5)
    assert past["data"] == []
    assert past["pagination"] == {
        "limit": 100,
        "offset": 5,
        "count": 0,
        "total": 5,
        "nextCursor": None,
    }


def test_empty_log(client, admin_headers):
    body = logs(client, admin_headers)
    assert body == {
        "data": [],
        "pagination": {"limit": 100, "offset": 0, "count": 0, "total": 0, "nextCursor": None},
    }


# ---------------------------------------------------------------------------------------------
# Entry fields


def test_allowed_entry_fields(client, admin_headers, clock):
    agent = make_agent(client, admin_headers, "a")
    rules = [{"type": "tool_allowlist", "tools": ["calendar.*"]}]
    policy = client.post(
        "/v1/policies",
        json={"agent_id": agent, "name": "cal", "rules": rules},
        headers=admin_headers,
    ).json
    decision = decide(
        client,
        admin_headers,
        agent,
        "calendar.read",
        day="monday",
        api_key="k-123",
        nested={"token": "t", "n": 1},
    )
    instant = clock.moment
    (entry,) = logs(client, admin_headers)["data"]
    assert set(entry) >= ENTRY_FIELDS
    assert entry["id"] == decision["auditId"]
    assert entry["agentId"] == agent
    assert entry["action"] == "authorize"
    assert entry["toolName"] == "calendar.read"
    assert entry["parameters"] == {
        "day": "monday",
        "api_key": MASK,
        "nested": {"token": MASK, "n": 1},
    }
    assert entry["result"] == "allowed"
    assert entry["policyId"] == policy["id"]
    assert entry["reason"] == decision["reason"]
    assert isinstance(entry["latencyMs"], int | float)
    assert not isinstance(entry["latencyMs"], bool)
    assert entry["latencyMs"] >= 0
    assert entry["timestamp"].endswith("Z") or entry["timestamp"][-6] in "+-"
    assert parse_ts(entry["timestamp"]) == instant


def test_default_deny_entry_has_null_policy(client, admin_headers, clock):
    agent = make_agent(client, admin_headers, "a", ALLOW_CALENDAR)
    decision = decide(client, admin_headers, agent, "email.send", to="x@example.com")
    instant = clock.moment  # the authorize request's one clock reading
    (entry,) = logs(client, admin_headers)["data"]
    assert entry["result"] == "denied"
    assert entry["policyId"] is None
    assert entry["reason"] == decision["reason"]
    assert entry["reason"]
    assert entry["parameters"] == {"to": "x@example.com"}
    assert parse_ts(entry["timestamp"]) == instant


def test_policy_deny_entry_names_the_policy(client, admin_headers):
    agent = make_agent(client, admin_headers, "a")
    rules = [{"type": "tool_denylist", "tools": ["shell.*"]}]
    policy = client.post(
        "/v1/policies",
        json={"agent_id": agent, "name": "no-shell", "rules": rules},
        headers=admin_headers,
    ).json
    decide(client, admin_headers, agent, "shell.exec")
    (entry,) = logs(client, admin_headers)["data"]
    assert (entry["result"], entry["policyId"]) == ("denied", policy["id"])


@pytest.mark.parametrize("status", ["suspended", "revoked"])
def test_agent_status_deny_is_audited_with_null_policy(client, admin_headers, status):
    agent = make_agent(client, admin_headers, "a", ALLOW_CALENDAR)
    patched = client.patch(f"/v1/agents/{agent}", json={"status": status}, headers=admin_headers)
    assert patched.status_code == 200
    decision = decide(client, admin_headers, agent, "calendar.read")
    assert decision["allowed"] is False
    (entry,) = logs(client, admin_headers)["data"]
    assert (entry["result"], entry["policyId"]) == ("denied", None)


def test_unknown_agent_decision_is_audited(client, admin_headers):
    ghost = "00000000-0000-4000-8000-00000000abcd"
    decide(client, admin_headers, ghost, "calendar.read")
    (entry,) = logs(client, admin_headers, agent_id=ghost)["data"]
    assert (entry["agentId"], entry["result"], entry["policyId"]) == (ghost, "denied", None)


def test_every_decision_writes_exactly_one_entry(client, admin_headers):
    agent = make_agent(client, admin_headers, "a", ALLOW_CALENDAR)
    audit_ids = [decide(client, admin_headers, agent, t)["auditId"] for t in ("calendar.x", "y")]
    assert ids_of(logs(client, admin_headers)) == audit_ids[::-1]


# ---------------------------------------------------------------------------------------------
# Scopes and tenants


def test_read_only_key_may_read(client, admin_headers, readonly_headers, history):
    as_admin = logs(client, admin_headers, agent_id=history["a"])
    as_reader = client.get(
        "/v1/audit-logs", query_string={"agent_id": history["a"]}, headers=readonly_headers
    )
    assert as_reader.status_code == 200
    assert as_reader.json == as_admin


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({}, id="no-key"),
        pytest.param({"Authorization": "Bearer svc_" + "0" * 32}, id="unknown-key"),
    ],
)
def test_unauthenticated_is_401(client, headers):
    response = client.get("/v1/audit-logs", headers=headers)
    assert response.status_code == 401
    assert response.json["error"]["code"] == "UNAUTHORIZED"


def test_other_workspace_entries_are_never_visible(client, admin_headers, other_workspace, history):
    theirs = other_workspace.headers("admin")
    their_agent = make_agent(client, theirs, "theirs", ALLOW_CALENDAR)
    their_ids = {
        decide(client, theirs, their_agent, tool)["auditId"]
        for tool in ("calendar.read", "email.send")
    }
    # a decision by our key naming their agent is ours (unknown agent), not theirs
    mine = decide(client, admin_headers, their_agent, "calendar.read")
    assert mine["allowed"] is False

    ours = logs(client, admin_headers, limit=1000)
    assert not their_ids & set(ids_of(ours))
    assert ours["pagination"]["total"] == 6
    by_agent = logs(client, admin_headers, agent_id=their_agent)
    assert ids_of(by_agent) == [mine["auditId"]]

    their_view = logs(client, theirs, limit=1000)
    assert set(ids_of(their_view)) == their_ids
    assert not set(history["labels"]) & set(ids_of(their_view))


# ---------------------------------------------------------------------------------------------
# Deleting an agent


def test_deleting_an_agent_removes_its_entries_only(client, admin_headers, history):
    ghost = "00000000-0000-4000-8000-00000000beef"
    decide(client, admin_headers, ghost, "calendar.read")
    before = logs(client, admin_headers, limit=1000)["data"]

    response = client.delete(f"/v1/agents/{history['a']}", headers=admin_headers)
    assert response.status_code == 204

    after = logs(client, admin_headers, limit=1000)
    assert after["pagination"]["total"] == 3
    assert after["data"] == [e for e in before if e["agentId"] != history["a"]]
    assert logs(client, admin_headers, agent_id=history["a"])["data"] == []
    assert len(logs(client, admin_headers, agent_id=history["b"])["data"]) == 2
    assert len(logs(client, admin_headers, agent_id=ghost)["data"]) == 1


def test_deleting_an_agent_erases_more_entries_than_one_batch(
    app, client, admin_headers, workspace, clock
):
    """Erased a batch a transaction (at most paced.MOST each): every one of them, none of
    another agent's, and the chain still verifies with each erased entry in its place."""
    from core.store import chain, paced

    gone = make_agent(client, admin_headers, "gone")
    kept = make_agent(client, admin_headers, "kept")
    count = 2 * paced.MOST + 7
    rows = [
        {
            "workspace_id": workspace.id, "agent_id": gone if n % 5 else kept,
            "agent_exists": True, "key_id": None, "tool_name": f"tool.{n % 3}",
            "parameters": {"n": n}, "result": "allowed", "policy_id": None,
            "rule_index": None, "reason": "r", "latency_ms": 1.0,
            "timestamp": clock.moment + timedelta(milliseconds=n),
        }
        for n in range(count)
    ]  # fmt: skip
    record_audit_entries(app, rows)
    theirs = sum(1 for row in rows if row["agent_id"] == gone)
    assert logs(client, admin_headers, agent_id=gone)["pagination"]["total"] == theirs
    assert client.delete(f"/v1/agents/{gone}", headers=admin_headers).status_code == 204
    assert client.get(f"/v1/agents/{gone}", headers=admin_headers).status_code == 404
    listed = logs(client, admin_headers, limit=1000)
    assert listed["pagination"]["total"] == count - theirs
    assert {entry["agentId"] for entry in listed["data"]} == {kept}
    db = app.extensions["agentauth"].db
    with db.transaction(snapshot=True) as session:
        report = chain.verify(session, workspace.id)
    assert report.ok
    assert (report.size, report.erased) == (count, theirs)


def test_timestamps_are_the_decision_instants(client, admin_headers, history):
    entries = logs(client, admin_headers)["data"]
    by_label = {history["labels"][e["id"]]: parse_ts(e["timestamp"]) for e in entries}
    assert by_label == history["at"]
