"""``GET /v1/audit-logs/export``: the CSV file (columns, headers, name), its rows (newest first,
filtered, redacted, formula-safe), scopes and tenants, and the 5,000-row limit with its
truncation headers."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from core.domain.redaction import MASK
from tests.api.helpers import decide, make_agent, record_audit_entries

COLUMNS = [
    "Timestamp", "Agent ID", "Tool", "Result", "Reason", "Latency (ms)", "Parameters",
    "Would-be result", "Would-be policy ID", "Would-be reason",
]  # fmt: skip
ALLOW_CALENDAR = [{"type": "tool_allowlist", "tools": ["calendar.*"]}]
LIMIT = 5000
TRUNCATION_HEADERS = ("X-Svc-Export-Truncated", "X-Svc-Export-Limit")


def export(client, headers, **query: Any):
    response = client.get("/v1/audit-logs/export", query_string=query, headers=headers)
    assert response.status_code == 200, response.get_data(as_text=True)
    return response


def parse(response) -> list[dict[str, str]]:
    """The CSV's data rows as dicts, after checking the header row."""
    rows = list(csv.reader(io.StringIO(response.get_data(as_text=True), newline="")))
    assert rows, "a CSV export always has a header row"
    assert rows[0] == COLUMNS
    return [dict(zip(COLUMNS, row, strict=True)) for row in rows[1:]]


def listed(client, headers, **query: Any) -> list[dict[str, Any]]:
    response = client.get("/v1/audit-logs", query_string={"limit": 1000, **query}, headers=headers)
    assert response.status_code == 200, response.get_data(as_text=True)
    return list(response.json["data"])


def append_entries(app, workspace, clock, agent_id: str, count: int, **fields: Any) -> None:
    """``count`` entries through the real write path, one clock reading (1 ms) apart, each
    with parameters ``{"i": n}`` in order of writing."""
    record_audit_entries(
        app,
        (
            {
                "workspace_id": workspace.id,
                "agent_id": agent_id,
                "agent_exists": True,
                "key_id": None,
                "tool_name": "bulk.tool",
                "parameters": {"i": n},
                "result": "denied",
                "policy_id": None,
                "rule_index": None,
                "reason": "bulk",
                "latency_ms": 0.25,
                "timestamp": clock(),
                **fields,
            }
            for n in range(count)
        ),
    )


@pytest.fixture
def history(client, admin_headers, clock) -> dict[str, Any]:
    a = make_agent(client, admin_headers, "a", ALLOW_CALENDAR)
    b = make_agent(client, admin_headers, "b")
    for agent, tool in [
        (a, "calendar.read"),
        (a, "email.send"),
        (b, "calendar.read"),
        (a, "calendar.write"),
    ]:
        clock.advance(600)
        decide(client, admin_headers, agent, tool, day="mon", password="hunter2")
    return {"a": a, "b": b}


# ---------------------------------------------------------------------------------------------
# The file


def test_header_row_and_response_headers(client, admin_headers, clock):
    response = export(client, admin_headers)
    assert response.mimetype == "text/csv"
    assert response.headers["Content-Type"].split(";")[0].strip() == "text/csv"
    expected_name = f"svc-audit-log-{clock.moment.date().isoformat()}.csv"
    assert response.headers["Content-Disposition"] == f'attachment; filename="{expected_name}"'
    assert parse(response) == []
    for header in TRUNCATION_HEADERS:
        assert header not in response.headers


@pytest.mark.parametrize(
    ("moment", "date"),
    [
        pytest.param(datetime(2027, 3, 4, 9, 30, tzinfo=UTC), "2027-03-04", id="morning"),
        pytest.param(datetime(2027, 12, 31, 23, 0, tzinfo=UTC), "2027-12-31", id="year-end"),
    ],
)
def test_filename_carries_the_date(client, admin_headers, clock, moment, date):
    clock.moment = moment
    response = export(client, admin_headers)
    assert (
        response.headers["Content-Disposition"]
        == f'attachment; filename="svc-audit-log-{date}.csv"'
    )


def test_rows_match_entries_newest_first(client, admin_headers, history):
    entries = listed(client, admin_headers)
    rows = parse(export(client, admin_headers))
    assert len(rows) == len(entries) == 4
    for row, entry in zip(rows, entries, strict=True):
        assert datetime.fromisoformat(row["Timestamp"]) == datetime.fromisoformat(
            entry["timestamp"]
        )
        assert row["Agent ID"] == entry["agentId"]
        assert row["Tool"] == entry["toolName"]
        assert row["Result"] == entry["result"]
        assert row["Reason"] == entry["reason"]
        assert float(row["Latency (ms)"]) >= 0
        assert float(row["Latency (ms)"]) == pytest.approx(entry["latencyMs"], abs=0.001)
        assert json.loads(row["Parameters"]) == entry["parameters"]
    stamps = [datetime.fromisoformat(row["Timestamp"]) for row in rows]
    assert stamps == sorted(stamps, reverse=True)
    assert len(set(stamps)) == len(stamps)
    assert [(r["Tool"], r["Result"]) for r in rows] == [
        ("calendar.write", "allowed"),
        ("calendar.read", "denied"),
        ("email.send", "denied"),
        ("calendar.read", "allowed"),
    ]


def test_parameters_are_redacted(client, admin_headers, history):
    body = export(client, admin_headers).get_data(as_text=True)
    assert "hunter2" not in body
    rows = parse(export(client, admin_headers))
    assert all(json.loads(r["Parameters"]) == {"day": "mon", "password": MASK} for r in rows)


@pytest.mark.parametrize(
    ("query", "count"),
    [
        pytest.param({"agent_id": "a"}, 3, id="agent"),
        pytest.param({"tool_name": "calendar.read"}, 2, id="tool"),
        pytest.param({"tool_name": "calendar.*"}, 0, id="tool-exact-only"),
        pytest.param({"result": "allowed"}, 2, id="allowed"),
        pytest.param({"result": "denied"}, 2, id="denied"),
        pytest.param({"result": "escalated"}, 0, id="escalated"),
        pytest.param({"action": "authorize"}, 4, id="action"),
        pytest.param({"action": "other"}, 0, id="action-other"),
        pytest.param({"agent_id": "b", "tool_name": "calendar.read"}, 1, id="agent-and-tool"),
        pytest.param({"from": 1}, 3, id="from-second-inclusive"),
        pytest.param({"to": 1}, 2, id="to-second-inclusive"),
        pytest.param({"from": 1, "to": 2}, 2, id="from-to"),
    ],
)
def test_filters_are_honoured(client, admin_headers, history, query, count):
    """The export holds exactly the entries the list shows for the same filters, in order."""
    oldest_first = listed(client, admin_headers)[::-1]
    resolved = {}
    for name, value in query.items():
        if name == "agent_id":
            resolved[name] = history[value]
        elif name in ("from", "to"):
            resolved[name] = oldest_first[value]["timestamp"]  # the n-th decision's instant
        else:
            resolved[name] = value
    expected = listed(client, admin_headers, **resolved)
    rows = parse(export(client, admin_headers, **resolved))
    assert len(rows) == count
    assert [(r["Timestamp"], r["Agent ID"], r["Tool"], r["Result"]) for r in rows] == [
        (e["timestamp"], e["agentId"], e["toolName"], e["result"]) for e in expected
    ]


@pytest.mark.parametrize(
    "query",
    [
        pytest.param({"agent_id": "not-a-uuid"}, id="agent-id-malformed"),
        pytest.param({"result": "maybe"}, id="result-maybe"),
        pytest.param({"from": "notadate"}, id="from-notadate"),
        pytest.param({"to": "notadate"}, id="to-notadate"),
        pytest.param({"tool_name": "calendar\x00"}, id="tool-name-nul"),
        pytest.param({"unknown": "1"}, id="unknown-parameter"),
        pytest.param({"limit": "10"}, id="limit-not-accepted"),
        pytest.param({"offset": "10"}, id="offset-not-accepted"),
    ],
)
def test_invalid_query_is_400(client, admin_headers, query):
    response = client.get("/v1/audit-logs/export", query_string=query, headers=admin_headers)
    assert response.status_code == 400
    assert response.json["error"]["code"] == "VALIDATION_ERROR"


# ---------------------------------------------------------------------------------------------
# Scopes and tenants


def test_read_only_key_may_export(client, admin_headers, readonly_headers, history):
    as_admin = export(client, admin_headers).get_data(as_text=True)
    response = client.get("/v1/audit-logs/export", headers=readonly_headers)
    assert response.status_code == 200
    assert response.get_data(as_text=True) == as_admin


def test_unauthenticated_is_401(client):
    response = client.get("/v1/audit-logs/export")
    assert response.status_code == 401
    assert response.json["error"]["code"] == "UNAUTHORIZED"


def test_other_workspace_entries_are_not_exported(client, admin_headers, other_workspace, history):
    theirs = other_workspace.headers("admin")
    their_agent = make_agent(client, theirs, "theirs", ALLOW_CALENDAR)
    decide(client, theirs, their_agent, "calendar.secret-tool")
    rows = parse(export(client, admin_headers))
    assert len(rows) == 4
    assert their_agent not in {r["Agent ID"] for r in rows}
    assert "calendar.secret-tool" not in {r["Tool"] for r in rows}
    their_rows = parse(export(client, theirs))
    assert [(r["Agent ID"], r["Tool"]) for r in their_rows] == [
        (their_agent, "calendar.secret-tool")
    ]


# ---------------------------------------------------------------------------------------------
# Formula injection


FORMULAS = ["=1+2", "+SUM(A1)", "-2+3", "@SUM(A1)", '=HYPERLINK("http://x")']


@pytest.mark.parametrize("tool", FORMULAS, ids=["eq", "plus", "minus", "at", "hyperlink"])
def test_tool_name_starting_a_formula_is_prefixed(client, admin_headers, tool):
    agent = make_agent(client, admin_headers, "a")
    decide(client, admin_headers, agent, tool, q="x")
    (row,) = parse(export(client, admin_headers))
    assert row["Tool"] == "'" + tool
    # the list endpoint is JSON, not a spreadsheet: it keeps the name as given
    assert listed(client, admin_headers)[0]["toolName"] == tool


@pytest.mark.parametrize("value", FORMULAS, ids=["eq", "plus", "minus", "at", "hyperlink"])
def test_parameter_value_starting_a_formula_cannot_start_a_cell(client, admin_headers, value):
    """Parameters are one JSON cell: it starts with ``{``, never with the value, and the value
    comes back unchanged inside it."""
    agent = make_agent(client, admin_headers, "a")
    decide(client, admin_headers, agent, "calendar.read", q=value)
    (row,) = parse(export(client, admin_headers))
    assert row["Parameters"][0] not in "=+-@\t\r"
    assert json.loads(row["Parameters"]) == {"q": value}


@pytest.mark.parametrize(
    ("column", "field", "text"),
    [
        pytest.param("Tool", "tool_name", "=cmd|' /C calc'!A0", id="tool-eq"),
        pytest.param("Tool", "tool_name", "\tx", id="tool-tab"),
        pytest.param("Tool", "tool_name", "\rx", id="tool-cr"),
        pytest.param("Reason", "reason", "+1", id="reason-plus"),
        pytest.param("Reason", "reason", "-1", id="reason-minus"),
        pytest.param("Reason", "reason", "@x", id="reason-at"),
        pytest.param("Reason", "reason", "=x", id="reason-eq"),
        pytest.param("Reason", "reason", "\tx", id="reason-tab"),
    ],
)
def test_any_cell_starting_a_formula_is_prefixed(
    app, client, admin_headers, workspace, clock, column, field, text
):
    """Through the real append path, for texts an HTTP request cannot carry (control
    characters) or that come from the engine (reasons)."""
    agent = make_agent(client, admin_headers, "a")
    append_entries(app, workspace, clock, agent, 1, **{field: text})
    (row,) = parse(export(client, admin_headers))
    assert row[column] == "'" + text


@pytest.mark.parametrize("tool", ["calendar.read", "a=b", "a-b", "x@y"], ids=str)
def test_ordinary_cells_are_not_prefixed(client, admin_headers, tool):
    agent = make_agent(client, admin_headers, "a")
    decide(client, admin_headers, agent, tool)
    (row,) = parse(export(client, admin_headers))
    assert row["Tool"] == tool


# ---------------------------------------------------------------------------------------------
# The 5,000-row limit


@pytest.mark.parametrize(
    ("total", "truncated"),
    [pytest.param(LIMIT, False, id="exactly-5000"), pytest.param(LIMIT + 1, True, id="5001")],
)
def test_row_limit(app, client, admin_headers, workspace, clock, total, truncated):
    """One decision through the API first (the oldest), the bulk appended directly, two more
    decisions through the API last (the newest)."""
    agent = make_agent(client, admin_headers, "a", ALLOW_CALENDAR)
    decide(client, admin_headers, agent, "calendar.oldest")
    bulk = total - 3
    append_entries(app, workspace, clock, agent, bulk)
    newest = [decide(client, admin_headers, agent, f"calendar.new{i}") for i in range(2)]
    assert listed(client, admin_headers, limit=1)[0]["id"] == newest[1]["auditId"]

    response = export(client, admin_headers)
    rows = parse(response)
    assert len(rows) == LIMIT
    assert [r["Tool"] for r in rows[:2]] == ["calendar.new1", "calendar.new0"]
    bulk_rows = [json.loads(r["Parameters"])["i"] for r in rows[2:] if r["Tool"] == "bulk.tool"]
    assert bulk_rows == list(range(bulk - 1, -1, -1))  # every bulk entry, newest first
    stamps = [datetime.fromisoformat(r["Timestamp"]) for r in rows]
    assert stamps == sorted(stamps, reverse=True)
    if truncated:
        assert response.headers["X-Svc-Export-Truncated"] == "true"
        assert response.headers["X-Svc-Export-Limit"] == "5000"
        assert "calendar.oldest" not in {r["Tool"] for r in rows}  # the oldest is cut
    else:
        for header in TRUNCATION_HEADERS:
            assert header not in response.headers
        assert rows[-1]["Tool"] == "calendar.oldest"


def test_filter_below_the_limit_is_not_truncated(app, client, admin_headers, workspace, clock):
    """5,001 entries in the log, but the filter matches 5,000: nothing is cut."""
    agent = make_agent(client, admin_headers, "a", ALLOW_CALENDAR)
    decide(client, admin_headers, agent, "calendar.read")  # allowed: filtered out below
    append_entries(app, workspace, clock, agent, LIMIT)
    everything = export(client, admin_headers)
    assert everything.headers["X-Svc-Export-Truncated"] == "true"
    assert len(parse(everything)) == LIMIT

    response = export(client, admin_headers, result="denied")
    rows = parse(response)
    assert len(rows) == LIMIT
    assert {r["Result"] for r in rows} == {"denied"}
    for header in TRUNCATION_HEADERS:
        assert header not in response.headers
