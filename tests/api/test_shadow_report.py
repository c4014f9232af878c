"""``GET /v1/policies/:id/shadow-report`` (decisions §10): exact counts over a log built with
known outcomes, for ranges whose edges fall inside minutes and hours, before and after the
tallies are folded into the rollup rows; samples newest first; the policy's agent only; 404
for another workspace's policy and 400 for a bad range."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import pytest

from core.store import auditcounts
from tests.api.helpers import assert_error, decide, instant, make_agent
from tests.api.test_modes import ALLOW_ALL, add_policy

#: the shadow policy's rules: denies refunds, asks a person for email, allows file deletion
SHADOW_RULES = [
    {"type": "tool_denylist", "tools": ["payments.refund"]},
    {"type": "require_approval", "tools": ["email.send"]},
    {"type": "tool_allowlist", "tools": ["files.delete"]},
]
#: the calls made, in order: (tool, how many); the real decisions allow all but files.delete
CALLS = [
    ("search.web", 2), ("payments.refund", 1), ("files.delete", 2), ("email.send", 1),
    ("search.web", 3), ("payments.refund", 2), ("files.delete", 2), ("email.send", 1),
]  # fmt: skip
#: seconds between two calls: odd, so the calls fall in many minutes and three hours
STEP = 397


@pytest.fixture
def shadowed(client, admin_headers, clock) -> dict[str, Any]:
    """An agent whose shadow policy changes three tools' decisions, its calls made with the
    clock moving on between them, and a second agent with a shadow policy of its own (whose
    calls must not count)."""
    agent = make_agent(client, admin_headers, "reported", ALLOW_ALL)
    add_policy(client, admin_headers, agent, [{"type": "tool_denylist", "tools": ["files.*"]}],
               priority=5)  # fmt: skip
    shadow = add_policy(client, admin_headers, agent, SHADOW_RULES, "shadow", priority=10)
    other = make_agent(client, admin_headers, "elsewhere", ALLOW_ALL)
    add_policy(client, admin_headers, other, SHADOW_RULES, "shadow", priority=10)
    for tool, times in CALLS:
        for _ in range(times):
            clock.advance(STEP)
            decide(client, admin_headers, agent, tool)
            decide(client, admin_headers, other, tool)
    return {"agent": agent, "policy": shadow}


def entries(client, headers, agent: str) -> list[dict[str, Any]]:
    listed = client.get(
        "/v1/audit-logs", query_string={"agent_id": agent, "limit": 1000}, headers=headers
    )
    assert listed.status_code == 200
    return list(listed.json["data"])


def expected(found: list[dict[str, Any]], policy: str, start: Any, end: Any) -> dict[str, Any]:
    """The report as counted from the entries themselves (newest first), over [start, end]."""
    inside = [e for e in found if start <= instant(e["timestamp"]) <= end and e["wouldBe"]]
    changed = [
        e
        for e in inside
        if e["wouldBe"]["policyId"] == policy and e["wouldBe"]["result"] != e["result"]
    ]
    split = Counter(e["wouldBe"]["result"] for e in changed)
    calls = Counter(e["toolName"] for e in inside)
    changes = Counter(e["toolName"] for e in changed)
    return {
        "calls": len(inside),
        "changed": len(changed),
        "wouldDeny": split["denied"],
        "wouldEscalate": split["escalated"],
        "wouldAllow": split["allowed"],
        "errors": sum(e["wouldBe"]["result"] == "error" for e in inside),
        "byTool": [
            {"toolName": tool, "calls": n, "changed": changes[tool]}
            for tool, n in sorted(calls.items(), key=lambda item: (-item[1], item[0]))
        ],
        "samples": [e["id"] for e in sorted(changed, key=lambda e: -e["seq"])][:20],
    }


def report(client, headers, policy: str, **query: str) -> dict[str, Any]:
    response = client.get(
        f"/v1/policies/{policy}/shadow-report", query_string=query, headers=headers
    )
    assert response.status_code == 200, response.get_data(as_text=True)
    return dict(response.json)


def counted(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in ("policyId", "mode", "from", "to")}


def test_the_report_counts_what_the_policy_would_have_changed(
    client, admin_headers, readonly_headers, shadowed, clock
):
    policy = shadowed["policy"]["id"]
    body = report(client, readonly_headers, policy)  # any scope
    assert (body["policyId"], body["mode"]) == (policy, "shadow")
    # to is now (after every call), from 7 days before it
    newest = max(instant(e["timestamp"]) for e in entries(client, admin_headers, shadowed["agent"]))
    assert newest <= instant(body["to"]) <= clock.moment
    assert instant(body["to"]) - instant(body["from"]) == timedelta(days=7)
    assert counted(body) == {
        "calls": 14,
        "changed": 9,
        "wouldDeny": 3,
        "wouldEscalate": 2,
        "wouldAllow": 4,
        "errors": 0,
        "byTool": [
            {"toolName": "search.web", "calls": 5, "changed": 0},
            {"toolName": "files.delete", "calls": 4, "changed": 4},
            {"toolName": "payments.refund", "calls": 3, "changed": 3},
            {"toolName": "email.send", "calls": 2, "changed": 2},
        ],
        "samples": expected(entries(client, admin_headers, shadowed["agent"]), policy,
                            instant(body["from"]), instant(body["to"]))["samples"],
    }  # fmt: skip
    assert len(body["samples"]) == 9


def test_the_counts_are_exact_for_any_range_folded_or_not(app, client, admin_headers, shadowed):
    policy = shadowed["policy"]["id"]
    found = entries(client, admin_headers, shadowed["agent"])
    times = sorted(instant(e["timestamp"]) for e in found)
    # edges inside minutes and hours, at an entry's own instant, and around everything
    ranges = [
        (times[0] - timedelta(hours=2), times[-1] + timedelta(hours=2)),
        (times[2], times[-3]),
        (times[3] + timedelta(seconds=17), times[11] - timedelta(seconds=29)),
        (times[5] - timedelta(microseconds=1), times[5]),
        (times[6] + timedelta(microseconds=1), times[9]),
        (times[0] + timedelta(minutes=61), times[0] + timedelta(minutes=61, seconds=30)),
    ]

    def check() -> None:
        for start, end in ranges:
            query = {"from": start.isoformat(), "to": end.isoformat()}
            wanted = expected(found, policy, start, end)
            assert counted(report(client, admin_headers, policy, **query)) == wanted, query

    check()  # the tallies not folded yet
    auditcounts.drain(app.extensions["agentauth"].db, paced=False)
    check()  # now from the rollup rows


def test_a_would_be_decision_that_failed_is_an_error_never_a_change(
    client, admin_headers, shadowed, monkeypatch
):
    from core.domain import modes

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("injected")

    monkeypatch.setattr(modes.Trial, "decided", property(broken))
    decide(client, admin_headers, shadowed["agent"], "payments.refund")
    monkeypatch.undo()
    body = report(client, admin_headers, shadowed["policy"]["id"])
    assert (body["calls"], body["changed"], body["errors"]) == (15, 9, 1)


def test_the_samples_are_the_twenty_newest_changes(client, admin_headers, shadowed, clock):
    for _ in range(25):
        clock.advance(1)
        decide(client, admin_headers, shadowed["agent"], "payments.refund")
    policy = shadowed["policy"]["id"]
    body = report(client, admin_headers, policy)
    newest = entries(client, admin_headers, shadowed["agent"])
    changed = [e["id"] for e in newest if e["toolName"] == "payments.refund"]
    assert body["samples"] == changed[:20]


def test_a_policy_deleted_with_its_agent_has_no_report(client, admin_headers, shadowed):
    policy = shadowed["policy"]
    assert client.delete(f"/v1/agents/{shadowed['agent']}", headers=admin_headers).status_code == (
        204
    )
    response = client.get(f"/v1/policies/{policy['id']}/shadow-report", headers=admin_headers)
    assert_error(response, 404, "POLICY_NOT_FOUND")


def test_another_workspace_s_policy_is_not_found(client, admin_headers, other_workspace, shadowed):
    response = client.get(
        f"/v1/policies/{shadowed['policy']['id']}/shadow-report",
        headers=other_workspace.headers("admin"),
    )
    assert_error(response, 404, "POLICY_NOT_FOUND")
    unknown = "9b2f7c1e-0000-4000-8000-000000000000"
    response = client.get(f"/v1/policies/{unknown}/shadow-report", headers=admin_headers)
    assert_error(response, 404, "POLICY_NOT_FOUND")


@pytest.mark.parametrize(
    ("query", "calls"),
    [
        ({"to": "0001-01-01T00:00:00Z"}, 0),  # no from: cut at the first instant there is
        ({"from": "0001-01-01T00:00:00Z", "to": "9999-12-31T23:59:59.999999Z"}, 14),
        ({"from": "2026-11-21T12:00:00+14:00"}, 14),  # another offset, the same instant
    ],
    ids=["to-year-1", "every-instant", "offset"],
)
def test_ranges_to_the_limits_of_time_are_answered(client, admin_headers, shadowed, query, calls):
    body = report(client, admin_headers, shadowed["policy"]["id"], **query)
    assert body["calls"] == calls


def test_a_range_before_year_1000_is_written_with_four_digit_years(client, admin_headers, shadowed):
    body = report(client, admin_headers, shadowed["policy"]["id"], to="0738-09-04T02:10:04.7822Z")
    assert (body["from"], body["to"]) == (
        "0738-08-28T02:10:04.782200Z",
        "0738-09-04T02:10:04.782200Z",
    )
    assert body["calls"] == 0


@pytest.mark.parametrize(
    "query",
    [
        {"from": "2026-11-21T12:00:00Z", "to": "2026-11-20T12:00:00Z"},
        {"from": "yesterday"},
        {"to": "2026-13-01T00:00:00Z"},
        {"tool_name": "search.web"},
    ],
    ids=["from-after-to", "from-not-a-time", "to-not-a-time", "unknown-parameter"],
)
def test_a_bad_range_is_refused(client, admin_headers, shadowed, query):
    response = client.get(
        f"/v1/policies/{shadowed['policy']['id']}/shadow-report",
        query_string=query,
        headers=admin_headers,
    )
    assert_error(response, 400, "VALIDATION_ERROR")
