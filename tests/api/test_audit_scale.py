"""The audit log at production scale (decisions §9), through the API: cursor walks, exact
totals, deep offsets, and ``GET /v1/audit-logs/stats``.

Entries are written through the real recorder with timestamps of the test's choosing, spread
over hours and minutes and mostly off their boundaries, and every expectation is computed here
from what was written: the counts the service keeps must answer exactly what counting the
entries would."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from core.domain.clock import isoformat
from core.store.auditpages import SCAN_LIMIT
from tests.api.helpers import assert_error, decide, instant, make_agent, record_audit_entries
from tests.api.test_audit_logs import ids_of, logs

#: six hours before the fake clock's start (2026-11-21T12:00Z): inside stats' default 24 hours
BASE = datetime(2026, 11, 21, 6, 0, tzinfo=UTC)
TOOLS = ("calendar.read", "email.send", "shell.exec")
RESULTS = ("allowed", "denied", "escalated")
ACTIONS = ("authorize", "authorize", "authorize", "approval.resolve")
SESSIONS = (None, None, "sess-a", "sess-b")
MINUTE, HOUR, DAY = timedelta(minutes=1), timedelta(hours=1), timedelta(days=1)
GRAIN = {"minute": MINUTE, "hour": HOUR, "day": DAY}
GROUP_FIELD = {"result": "result", "agent": "agent_id", "tool": "tool_name"}
#: the instant several entries share (ties, broken by id)
TIE = BASE + timedelta(hours=3, minutes=33, seconds=33, microseconds=333_333)


def t(hours: int = 0, minutes: int = 0, seconds: int = 0, micro: int = 0) -> datetime:
    return BASE + timedelta(hours=hours, minutes=minutes, seconds=seconds, microseconds=micro)


#: instants on or next to boundaries, each an entry of the spread (besides the random ones)
SPECIAL = [
    t(1),  # on an hour
    t(2),
    t(2, micro=1),
    t(3),
    t(3, micro=-1),
    t(1, 17),  # on a minute
    t(2, 43),
    t(1, 59, 59, 999_999),
    t(1, 59, 40, 250_000),  # under a minute either side of 08:00
    t(1, 59, 50, 500_000),
    t(2, 0, 5, 750_000),
    t(2, 0, 10),
    t(2, 10, 40),  # under a minute either side of 08:11
    t(2, 10, 50),
    t(2, 11, 5),
    t(2, 11, 15),
    datetime(2026, 11, 20, 23, 59, 50, 123_000, tzinfo=UTC),  # either side of midnight
    datetime(2026, 11, 20, 23, 59, 59, 999_999, tzinfo=UTC),
    datetime(2026, 11, 21, 0, 0, tzinfo=UTC),
    datetime(2026, 11, 21, 0, 0, 7, 500_000, tzinfo=UTC),
    datetime(2026, 11, 20, 12, 0, tzinfo=UTC),  # 24 hours before the clock: outside the default
    datetime(2026, 11, 20, 12, 0, 0, 500_000, tzinfo=UTC),  # inside it
    datetime(2026, 11, 20, 11, 30, tzinfo=UTC),
    datetime(2026, 11, 21, 13, 30, tzinfo=UTC),  # after the clock
    *[TIE] * 5,
]


@dataclass(frozen=True)
class Written:
    """One entry as the test wrote it; ``n`` is its ``parameters["n"]``."""

    n: int
    agent_id: str
    tool_name: str
    result: str
    action: str
    session_id: str | None
    timestamp: datetime


@dataclass
class Spread:
    agents: list[str]
    entries: list[Written]


def fields(workspace_id: str, entry: Written, exists: bool = True) -> dict[str, Any]:
    """What ``core.store.audit.entry`` takes for ``entry``."""
    return {
        "workspace_id": workspace_id,
        "agent_id": entry.agent_id,
        "agent_exists": exists,
        "key_id": None,
        "tool_name": entry.tool_name,
        "parameters": {"n": entry.n},
        "result": entry.result,
        "policy_id": None,
        "rule_index": None,
        "reason": "written by the test",
        "latency_ms": 0.5,
        "timestamp": entry.timestamp,
        "session_id": entry.session_id,
        "action": entry.action,
    }


def invent(agents: list[str], moments: list[datetime], seed: int, first_n: int) -> list[Written]:
    rng = random.Random(seed)  # noqa: S311 (test data, the same each run)
    return [
        Written(
            n=first_n + i,
            agent_id=rng.choice(agents),
            tool_name=rng.choice(TOOLS),
            result=rng.choice(RESULTS),
            action=rng.choice(ACTIONS),
            session_id=rng.choice(SESSIONS),
            timestamp=moment,
        )
        for i, moment in enumerate(moments)
    ]


def random_moments(rng: random.Random, count: int, start: datetime, span: timedelta) -> list:
    micros = span // timedelta(microseconds=1)
    return [start + timedelta(microseconds=rng.randrange(micros)) for _ in range(count)]


@pytest.fixture
def spread(app, client, admin_headers, workspace) -> Spread:
    """About 450 entries of three agents: 420 at random instants over five hours from BASE,
    and the SPECIAL ones."""
    agents = [make_agent(client, admin_headers, f"agent-{i}") for i in range(3)]
    rng = random.Random(7)  # noqa: S311 (test data, the same each run)
    moments = random_moments(rng, 420, BASE, 5 * HOUR) + SPECIAL
    entries = invent(agents, moments, seed=11, first_n=0)
    record_audit_entries(app, (fields(workspace.id, e) for e in entries))
    return Spread(agents, entries)


def resolve(spread: Spread, query: dict[str, Any]) -> dict[str, Any]:
    """The query string of a query written with agent indexes and datetimes."""
    out: dict[str, Any] = {}
    for name, value in query.items():
        if name == "agent_id":
            out[name] = spread.agents[value]
        elif isinstance(value, datetime):
            out[name] = isoformat(value)
        else:
            out[name] = value
    return out


def matching(
    entries: list[Written], spread: Spread, query: dict[str, Any], default_range: Any = None
) -> list[Written]:
    """The entries ``query`` matches, newest first (ties in any order)."""
    since, until = query.get("from"), query.get("to")
    if default_range is not None:
        since, until = since or default_range[0], until or default_range[1]
    found = [
        e
        for e in entries
        if ("agent_id" not in query or e.agent_id == spread.agents[query["agent_id"]])
        and all(
            getattr(e, name) == query[name]
            for name in ("tool_name", "result", "action", "session_id")
            if name in query
        )
        and (since is None or e.timestamp >= since)
        and (until is None or e.timestamp <= until)
    ]
    return sorted(found, key=lambda e: e.timestamp, reverse=True)


def assert_serves(served: list[dict[str, Any]], expected: list[Written]) -> None:
    """``served`` is every entry of ``expected`` exactly once, newest first, ties by id
    descending."""
    numbers = [entry["parameters"]["n"] for entry in served]
    assert len(numbers) == len(set(numbers)), "an entry was served twice"
    assert set(numbers) == {e.n for e in expected}
    assert [instant(e["timestamp"]) for e in served] == [e.timestamp for e in expected]
    for newer, older in itertools.pairwise(served):
        if newer["timestamp"] == older["timestamp"]:
            assert newer["id"] > older["id"], "ties are broken by id, descending"


def walk(client, headers, limit: int, query: dict[str, Any]) -> list[dict[str, Any]]:
    """Every page of a walk: the first without a cursor, then each page's nextCursor."""
    pages = [logs(client, headers, limit=limit, **query)]
    while pages[-1]["pagination"]["nextCursor"] is not None:
        assert len(pages) < 2000, "the walk does not end"
        following = pages[-1]["pagination"]["nextCursor"]
        assert len(following) <= 512
        pages.append(logs(client, headers, limit=limit, cursor=following, **query))
    return pages


def served(pages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [entry for page in pages for entry in page["data"]]


# ---------------------------------------------------------------------------------------------
# Cursor walks

WALKS = [
    pytest.param({}, 7, id="no-filter"),
    pytest.param({"agent_id": 1}, 7, id="agent"),
    pytest.param({"tool_name": "email.send"}, 7, id="tool"),
    pytest.param({"result": "escalated"}, 7, id="result"),
    pytest.param({"action": "approval.resolve"}, 5, id="action"),
    pytest.param({"session_id": "sess-a"}, 5, id="session"),
    pytest.param({"from": t(1, 17, 23, 456_789), "to": TIE}, 7, id="from-to"),
    pytest.param({"from": t(2, 0, 5, 750_000)}, 7, id="from-only"),
    pytest.param({"to": t(1, micro=-1)}, 7, id="to-only"),
    pytest.param({"from": TIE - MINUTE, "to": TIE + MINUTE}, 2, id="ties-across-pages"),
    pytest.param(
        {"agent_id": 0, "tool_name": "calendar.read", "result": "denied"}, 3, id="agent-tool-result"
    ),
    pytest.param({"session_id": "sess-b", "agent_id": 2}, 3, id="session-and-agent"),
    pytest.param(
        {"tool_name": "shell.exec", "action": "authorize", "from": t(0, 30, 0, 1), "to": t(4)},
        4,
        id="tool-action-range",
    ),
    pytest.param({"tool_name": "none.such"}, 5, id="nothing-matches"),
    pytest.param({}, 1000, id="one-page"),
]


@pytest.mark.parametrize(("query", "limit"), WALKS)
def test_cursor_walk_serves_every_match_once_newest_first(
    client, admin_headers, spread, query, limit
):
    expected = matching(spread.entries, spread, query)
    resolved = resolve(spread, query)
    pages = walk(client, admin_headers, limit, resolved)
    assert_serves(served(pages), expected)
    for number, page in enumerate(pages):
        assert page["pagination"]["total"] == len(expected)
        assert page["pagination"]["count"] == len(page["data"]) <= limit
        # page by page, what the offset listing serves
        by_offset = logs(client, admin_headers, limit=limit, offset=number * limit, **resolved)
        assert ids_of(page) == ids_of(by_offset)
    assert ids_of({"data": served(pages)}) == ids_of(
        logs(client, admin_headers, limit=1000, **resolved)
    )


def more_entries(spread: Spread, seed: int, first_n: int) -> list[Written]:
    """Entries among the old ones (between and tied with them) and newer than all."""
    rng = random.Random(seed)  # noqa: S311 (test data, the same each run)
    moments = random_moments(rng, 25, BASE, 5 * HOUR)
    moments += [TIE, t(1), t(2, 0, 10), BASE + 6 * HOUR, BASE + 6 * HOUR + MINUTE]
    moments += [e.timestamp for e in rng.sample(spread.entries, 5)]
    return invent(spread.agents, moments, seed=seed, first_n=first_n)


@pytest.mark.parametrize(
    "query",
    [
        pytest.param({}, id="no-filter"),
        pytest.param({"agent_id": 0}, id="agent"),
        pytest.param({"tool_name": "calendar.read", "result": "denied"}, id="tool-result"),
        pytest.param({"from": t(0, 45, 12, 345_678), "to": t(3, 2, 1, 1)}, id="from-to"),
    ],
)
def test_entries_committed_during_a_walk_never_appear_in_it(
    app, client, admin_headers, workspace, clock, spread, query
):
    before = matching(spread.entries, spread, query)
    resolved = resolve(spread, query)
    now = list(spread.entries)
    pages = [logs(client, admin_headers, limit=6, **resolved)]
    assert pages[0]["pagination"]["total"] == len(before)
    writes = 0
    while pages[-1]["pagination"]["nextCursor"] is not None:
        if writes < 3:  # between the first pages, entries among the ones still to come
            added = more_entries(spread, seed=100 + writes, first_n=10_000 + 100 * writes)
            record_audit_entries(app, (fields(workspace.id, e) for e in added))
            n = 20_000 + writes
            decide(client, admin_headers, spread.agents[0], "calendar.read", n=n)
            decision = Written(
                n, spread.agents[0], "calendar.read", "denied", "authorize", None, clock.moment
            )
            now += [*added, decision]
            writes += 1
        following = pages[-1]["pagination"]["nextCursor"]
        pages.append(logs(client, admin_headers, limit=6, cursor=following, **resolved))
        # every page counts the matches at that moment, the new ones with them
        assert pages[-1]["pagination"]["total"] == len(matching(now, spread, query))
    assert writes == 3, "the walk was long enough to write between its pages"
    assert_serves(served(pages), before)
    # a walk started now serves the new entries too
    assert_serves(served(walk(client, admin_headers, 50, resolved)), matching(now, spread, query))


def test_a_cursor_walk_holds_the_same_filters_however_they_are_spelled(
    client, admin_headers, spread
):
    since = t(1, 17, 23, 456_789)
    query = {"agent_id": spread.agents[1], "from": isoformat(since)}
    first = logs(client, admin_headers, limit=5, **query)
    respelled = {
        "agent_id": spread.agents[1].upper(),
        "from": since.astimezone(timezone(timedelta(hours=-5))).isoformat(),
    }
    following = first["pagination"]["nextCursor"]
    second = logs(client, admin_headers, limit=5, cursor=following, **respelled)
    assert ids_of(second) == ids_of(logs(client, admin_headers, limit=5, offset=5, **query))


def change_one_character(text: str, index: int) -> str:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    value = alphabet.index(text[index])
    return text[:index] + alphabet[value ^ 1] + text[index + 1 :]


WALK_FROM = t(0, 30, 30, 30)


def same(cursor: str) -> str:
    return cursor


REFUSALS = [
    pytest.param(same, {"offset": 1}, False, id="with-offset"),
    pytest.param(same, {"offset": 6}, False, id="with-the-next-offset"),
    pytest.param(lambda c: "not-a-cursor", {}, False, id="malformed"),
    pytest.param(lambda c: "", {}, False, id="empty"),
    pytest.param(lambda c: c + ".x", {}, False, id="two-dots"),
    pytest.param(lambda c: "A" * 513, {}, False, id="too-long"),
    pytest.param(lambda c: c + "A" * 513, {}, False, id="too-long-sealed-prefix"),
    pytest.param(lambda c: change_one_character(c, 0), {}, False, id="body-first-char-changed"),
    pytest.param(
        lambda c: change_one_character(c, c.index(".") - 1), {}, False, id="body-last-char-changed"
    ),
    pytest.param(
        lambda c: change_one_character(c, c.index(".") + 1), {}, False, id="tag-first-char-changed"
    ),
    pytest.param(
        lambda c: change_one_character(c, len(c) - 1), {}, False, id="tag-last-char-changed"
    ),
    pytest.param(same, {"agent_id": None, "from": None}, False, id="filters-dropped"),
    pytest.param(same, {"result": "denied"}, False, id="filter-added"),
    pytest.param(same, {"agent_id": 1}, False, id="other-agent"),
    pytest.param(
        same, {"from": WALK_FROM + timedelta(microseconds=1)}, False, id="from-moved-a-microsecond"
    ),
    pytest.param(same, {}, True, id="other-workspace"),
]


@pytest.mark.parametrize(("alter", "changes", "elsewhere"), REFUSALS)
def test_a_cursor_that_is_not_this_walks_is_refused(
    client, admin_headers, other_workspace, spread, alter, changes, elsewhere
):
    """The walk: agent 0's entries from WALK_FROM on; its first page's cursor, altered or
    sent with ``changes`` to the filters (None: the filter left out), or from another
    workspace."""
    query = {"agent_id": 0, "from": WALK_FROM}
    first = logs(client, admin_headers, limit=6, **resolve(spread, query))
    cursor = first["pagination"]["nextCursor"]
    assert cursor is not None
    asked = {name: value for name, value in (query | changes).items() if value is not None}
    headers = other_workspace.headers("admin") if elsewhere else admin_headers
    refused = resolve(spread, asked) | {"cursor": alter(cursor)}
    response = client.get("/v1/audit-logs", query_string=refused, headers=headers)
    error = assert_error(response, 400, "VALIDATION_ERROR")
    assert "cursor" in [detail["field"] for detail in error["details"]], error


def test_the_cursor_of_an_offset_page_continues_after_it(client, admin_headers, spread):
    full = ids_of(logs(client, admin_headers, limit=1000))
    page = logs(client, admin_headers, limit=9, offset=100)
    assert ids_of(page) == full[100:109]
    after = logs(client, admin_headers, limit=9, cursor=page["pagination"]["nextCursor"])
    assert ids_of(after) == full[109:118]
    assert after["pagination"]["offset"] == 0


# ---------------------------------------------------------------------------------------------
# Totals

RANGES = [
    pytest.param({}, id="everything"),
    pytest.param({"from": t(1, 17, 23, 456_789), "to": t(1, 48, 2, 1)}, id="inside-minutes"),
    pytest.param({"from": t(0, 3, 11, 500_000), "to": t(4, 56, 59, 999_999)}, id="across-hours"),
    pytest.param({"from": t(1, 17), "to": t(2, 43)}, id="on-minutes"),
    pytest.param({"from": t(1), "to": t(3)}, id="on-hours"),
    pytest.param(
        {"from": t(2, 10, 5, 100_000), "to": t(2, 10, 55, 900_000)}, id="inside-one-minute"
    ),
    pytest.param({"from": t(1, 59, 30), "to": t(2, 0, 20)}, id="under-a-minute-across-an-hour"),
    pytest.param(
        {"from": t(2, 10, 30, 500_000), "to": t(2, 11, 20, 250_000)},
        id="under-a-minute-across-a-minute",
    ),
    pytest.param({"from": t(2, 37, 13, 131_313)}, id="from-only"),
    pytest.param({"to": t(2, 37, 13, 131_313)}, id="to-only"),
    pytest.param({"to": t(2)}, id="to-on-an-entry-at-an-hour"),
    pytest.param({"from": t(2, micro=1)}, id="from-on-an-entry-a-microsecond-past-an-hour"),
    pytest.param({"from": t(1), "to": t(1)}, id="from-is-to-on-an-entry"),
    pytest.param({"from": TIE, "to": TIE}, id="from-is-to-on-ties"),
    pytest.param({"from": t(3, 0, 0, 1), "to": t(3)}, id="from-after-to"),
    pytest.param(
        {
            "from": datetime(2026, 11, 20, 23, 59, 55, tzinfo=UTC),
            "to": datetime(2026, 11, 21, 0, 0, 3, tzinfo=UTC),
        },
        id="across-midnight",
    ),
    pytest.param(
        {"from": "0001-01-01T00:00:00Z", "to": "9999-12-31T23:59:59.999999Z"}, id="the-widest"
    ),
]

FILTERED = [
    pytest.param({"agent_id": 2}, id="agent"),
    pytest.param({"tool_name": "shell.exec"}, id="tool"),
    pytest.param({"result": "allowed", "action": "authorize"}, id="result-action"),
    pytest.param({"session_id": "sess-a"}, id="session"),
    pytest.param({"agent_id": 0, "tool_name": "email.send"}, id="agent-tool"),
    pytest.param(
        {"agent_id": 1, "tool_name": "email.send", "result": "denied"}, id="agent-tool-result"
    ),
    pytest.param({"session_id": "sess-b", "agent_id": 0}, id="session-agent"),
    pytest.param(
        {"session_id": "sess-a", "tool_name": "calendar.read", "result": "escalated"},
        id="session-tool-result",
    ),
    pytest.param({"action": "approval.resolve", "tool_name": "shell.exec"}, id="action-tool"),
    pytest.param({"seq_from": 40, "seq_to": 300}, id="seq-range"),
]


def count(spread: Spread, query: dict[str, Any], entries: list[Written] | None = None) -> int:
    """How many of ``entries`` (by default the spread's) ``query`` matches."""
    given = spread.entries if entries is None else entries
    typed = {
        k: instant(v) if isinstance(v, str) and k in ("from", "to") else v for k, v in query.items()
    }
    if "seq_from" in typed:  # the spread's entries take seqs 1.. in the order written
        first, last = typed.pop("seq_from"), typed.pop("seq_to")
        given = [e for e in given if first <= e.n + 1 <= last]
    return len(matching(given, spread, typed))


@pytest.mark.parametrize("query", RANGES)
def test_total_is_exact_for_any_range(client, admin_headers, spread, query):
    body = logs(client, admin_headers, limit=1, **resolve(spread, query))
    assert body["pagination"]["total"] == count(spread, query)


@pytest.mark.parametrize(
    "time_range",
    [
        pytest.param({}, id="everything"),
        pytest.param(
            {"from": t(0, 3, 11, 500_000), "to": t(4, 56, 59, 999_999)}, id="across-hours"
        ),
        pytest.param({"from": t(1, 59, 30), "to": t(2, 0, 20)}, id="under-a-minute-across-an-hour"),
        pytest.param({"from": t(1, 17), "to": t(2, 43, 0, 1)}, id="minute-to-past-a-minute"),
    ],
)
@pytest.mark.parametrize("filters", FILTERED)
def test_total_is_exact_for_any_filter(client, admin_headers, spread, filters, time_range):
    query = {**filters, **time_range}
    body = logs(client, admin_headers, limit=1000, **resolve(spread, query))
    assert body["pagination"]["total"] == count(spread, query) == len(body["data"])


def test_spread_seqs_follow_the_order_written(client, admin_headers, spread):
    """What the seq-range cases assume: entries recorded in one call take seqs in order."""
    body = logs(client, admin_headers, limit=1000)
    assert {e["parameters"]["n"] + 1 for e in body["data"]} == {e["seq"] for e in body["data"]}
    assert all(e["parameters"]["n"] + 1 == e["seq"] for e in body["data"])


@pytest.mark.parametrize(
    "query",
    [
        pytest.param({}, id="everything"),
        pytest.param({"agent_id": 0}, id="the-deleted-agent"),
        pytest.param({"agent_id": 1}, id="another-agent"),
        pytest.param({"tool_name": "email.send"}, id="tool"),
        pytest.param({"session_id": "sess-a"}, id="session"),
        pytest.param({"result": "denied", "action": "authorize"}, id="result-action"),
        pytest.param({"from": t(1, 17, 23, 456_789), "to": t(3, 48, 2, 1)}, id="across-hours"),
        pytest.param({"from": t(1, 59, 30), "to": t(2, 0, 20)}, id="under-a-minute-across-an-hour"),
        pytest.param({"session_id": "sess-b", "agent_id": 0}, id="session-and-deleted-agent"),
    ],
)
def test_totals_drop_when_an_agent_is_deleted(client, admin_headers, spread, query):
    resolved = resolve(spread, query)
    assert logs(client, admin_headers, limit=1, **resolved)["pagination"]["total"] == count(
        spread, query
    )
    deleted = client.delete(f"/v1/agents/{spread.agents[0]}", headers=admin_headers)
    assert deleted.status_code == 204
    kept = [e for e in spread.entries if e.agent_id != spread.agents[0]]
    body = logs(client, admin_headers, limit=1000, **resolved)
    assert body["pagination"]["total"] == count(spread, query, kept) == len(body["data"])


# ---------------------------------------------------------------------------------------------
# Deep offsets


def edge_offsets(entries: list[Written]) -> list[int]:
    """Offsets at which the newest-first listing crosses into an older hour or minute (both
    sides of each hour edge, some of the minute edges), and past the end."""
    hour_edges, minute_edges = [], []
    for i, (newer, older) in enumerate(itertools.pairwise(entries), start=1):
        if newer.timestamp.replace(minute=0, second=0, microsecond=0) != older.timestamp.replace(
            minute=0, second=0, microsecond=0
        ):
            hour_edges += [i - 1, i]
        elif newer.timestamp.replace(second=0, microsecond=0) != older.timestamp.replace(
            second=0, microsecond=0
        ):
            minute_edges.append(i)
    total = len(entries)
    chosen = {1, *hour_edges, *minute_edges[::13], total - 1, total, total + 3}
    return sorted(k for k in chosen if k >= 0)


@pytest.mark.parametrize(
    "query",
    [
        pytest.param({}, id="no-filter"),
        pytest.param({"agent_id": 1}, id="agent"),
        pytest.param({"tool_name": "calendar.read", "result": "denied"}, id="tool-result"),
        pytest.param({"session_id": "sess-a"}, id="session"),
        pytest.param({"session_id": "sess-b", "agent_id": 2}, id="session-agent"),
        pytest.param({"action": "authorize"}, id="action"),
        pytest.param({"from": t(1, 17, 23, 456_789), "to": t(4, 1, 2, 3)}, id="inside-minutes"),
        pytest.param({"from": t(1), "to": t(3)}, id="on-hours"),
        pytest.param({"from": t(1, 59, 30), "to": t(2, 0, 20)}, id="under-a-minute-across-an-hour"),
        pytest.param(
            {"from": t(2, 10, 30, 500_000), "to": t(2, 11, 20, 250_000)},
            id="under-a-minute-across-a-minute",
        ),
        pytest.param({"from": TIE - MINUTE, "to": TIE + MINUTE}, id="ties"),
    ],
)
def test_offset_pages_are_slices_of_the_full_listing(client, admin_headers, spread, query):
    resolved = resolve(spread, query)
    expected = matching(spread.entries, spread, query)
    full = logs(client, admin_headers, limit=1000, **resolved)
    assert_serves(full["data"], expected)
    every = ids_of(full)
    for offset in edge_offsets(expected):
        page = logs(client, admin_headers, limit=4, offset=offset, **resolved)
        assert ids_of(page) == every[offset : offset + 4], f"offset {offset} of {len(every)}"
        assert page["pagination"]["total"] == len(every)
        following = page["pagination"]["nextCursor"]
        assert (following is None) == (offset + 4 >= len(every)), f"offset {offset}"
        if following is not None:
            after = logs(client, admin_headers, limit=4, cursor=following, **resolved)
            assert ids_of(after) == every[offset + 4 : offset + 8], f"after offset {offset}"


# ---------------------------------------------------------------------------------------------
# A walk whose other filters match rarely

RARE_AGENT = "7d1b6c2a-3e4f-4a5b-8c6d-0e1f2a3b4c5d"
OTHER_AGENT = "8e2c7d3b-4f5a-4b6c-9d7e-1f2a3b4c5d6e"


def test_a_walk_past_many_non_matching_entries_still_serves_every_match(
    app, client, admin_headers, workspace
):
    """Twice as many entries as one page looks through lie between the newest match and the
    others (so one page comes back short and the next empty, each naming the page after it):
    the walk goes on until it has served every match, once."""
    plan: list[tuple[str, str, datetime]] = [(RARE_AGENT, "rare.tool", BASE + 10 * HOUR)]
    plan += [
        (RARE_AGENT, "noise.tool", BASE + 9 * HOUR - timedelta(milliseconds=250 * i))
        for i in range(2 * SCAN_LIMIT + 1_000)
    ]
    plan += [
        (RARE_AGENT, "rare.tool", BASE + 5 * HOUR),
        (OTHER_AGENT, "rare.tool", BASE + 4 * HOUR),
        (RARE_AGENT, "rare.tool", BASE + 3 * HOUR),
        (RARE_AGENT, "rare.tool", BASE + 2 * HOUR),
    ]
    entries = [
        Written(n, agent, tool, "denied", "authorize", None, moment)
        for n, (agent, tool, moment) in enumerate(plan)
    ]
    record_audit_entries(app, (fields(workspace.id, e, exists=False) for e in entries))
    rare = matching(entries, Spread([RARE_AGENT], []), {"agent_id": 0, "tool_name": "rare.tool"})
    assert len(rare) == 4
    query = {"agent_id": RARE_AGENT, "tool_name": "rare.tool"}
    pages = walk(client, admin_headers, 2, query)
    assert_serves(served(pages), rare)
    assert all(page["pagination"]["total"] == 4 for page in pages)
    assert all(page["pagination"]["count"] <= 2 for page in pages)
    by_offset = logs(client, admin_headers, limit=2, offset=2, **query)
    assert [e["parameters"]["n"] for e in by_offset["data"]] == [e.n for e in rare[2:]]


# ---------------------------------------------------------------------------------------------
# Counts over time


def stats(client, headers, **query: Any) -> list[dict[str, Any]]:
    response = client.get("/v1/audit-logs/stats", query_string=query, headers=headers)
    assert response.status_code == 200, response.get_data(as_text=True)
    assert set(response.json) == {"data"}
    return list(response.json["data"])


def floor(moment: datetime, grain: timedelta) -> datetime:
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    return moment - (moment - epoch) % grain


def expected_stats(
    entries: list[Written],
    spread: Spread,
    query: dict[str, Any],
    bucket: str,
    group_by: str | None,
    now: datetime,
) -> list[dict[str, Any]]:
    until = query.get("to", now)
    since = query.get("from", until - DAY)
    found = matching(entries, spread, query, default_range=(since, until))
    counted = Counter(
        (
            floor(e.timestamp, GRAIN[bucket]),
            None if group_by is None else getattr(e, GROUP_FIELD[group_by]),
        )
        for e in found
    )
    return [
        {"start": isoformat(start), "key": key, "count": n}
        for (start, key), n in sorted(
            counted.items(), key=lambda item: (item[0][0], item[0][1] or "")
        )
    ]


def in_start_order(data: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``data`` (asserting its items come in ``start`` order), in start then key order."""
    starts = [instant(item["start"]) for item in data]
    assert starts == sorted(starts), "items come in start order"
    return sorted(data, key=lambda item: (item["start"], item["key"] or ""))


STATS = [
    pytest.param("hour", None, {}, id="hour-default-range"),
    pytest.param("minute", None, {}, id="minute-default-range"),
    pytest.param("day", None, {}, id="day-default-range"),
    pytest.param("hour", "result", {}, id="hour-by-result"),
    pytest.param("hour", "agent", {}, id="hour-by-agent"),
    pytest.param("day", "tool", {}, id="day-by-tool"),
    pytest.param(
        "minute",
        None,
        {"from": t(1, 17, 23, 456_789), "to": t(2, 48, 2, 1)},
        id="minute-inside-minutes",
    ),
    pytest.param(
        "hour",
        None,
        {"from": t(1, 17, 23, 456_789), "to": t(3, 3, 0, 500_000)},
        id="hour-partial-first-and-last",
    ),
    pytest.param("hour", None, {"from": t(1), "to": t(3)}, id="hour-on-hours"),
    pytest.param(
        "minute",
        "agent",
        {"from": t(2, 10, 5, 100_000), "to": t(2, 15, 55, 900_000)},
        id="minute-by-agent-few-minutes",
    ),
    pytest.param(
        "minute",
        None,
        {"from": t(1, 59, 30), "to": t(2, 0, 20)},
        id="minute-under-a-minute-across-an-hour",
    ),
    pytest.param(
        "hour",
        None,
        {"from": t(1, 59, 30), "to": t(2, 0, 20)},
        id="hour-under-a-minute-across-an-hour",
    ),
    pytest.param(
        "minute",
        "result",
        {"from": t(2, 10, 30, 500_000), "to": t(2, 11, 20, 250_000)},
        id="minute-under-a-minute-across-a-minute",
    ),
    pytest.param(
        "day",
        None,
        {
            "from": datetime(2026, 11, 20, 23, 59, 55, tzinfo=UTC),
            "to": datetime(2026, 11, 21, 0, 0, 3, tzinfo=UTC),
        },
        id="day-under-a-minute-across-midnight",
    ),
    pytest.param(
        "day",
        None,
        {
            "from": datetime(2026, 11, 20, 23, 58, 30, tzinfo=UTC),
            "to": datetime(2026, 11, 21, 0, 1, 30, tzinfo=UTC),
        },
        id="day-minutes-across-midnight",
    ),
    pytest.param(
        "day",
        "agent",
        {
            "from": datetime(2026, 11, 19, 3, 4, 5, 6, tzinfo=UTC),
            "to": datetime(2026, 11, 22, 1, tzinfo=UTC),
        },
        id="day-by-agent-several-days",
    ),
    pytest.param("hour", None, {"agent_id": 1}, id="hour-agent"),
    pytest.param("hour", "tool", {"agent_id": 0}, id="hour-agent-by-tool"),
    pytest.param("hour", "agent", {"tool_name": "email.send"}, id="hour-tool-by-agent"),
    pytest.param(
        "minute",
        "result",
        {"agent_id": 2, "tool_name": "shell.exec"},
        id="minute-agent-tool-by-result",
    ),
    pytest.param("hour", "result", {"result": "denied"}, id="hour-result-by-result"),
    pytest.param("hour", None, {"session_id": "sess-a"}, id="hour-session"),
    pytest.param("hour", "tool", {"session_id": "sess-b"}, id="hour-session-by-tool"),
    pytest.param(
        "minute",
        "agent",
        {"session_id": "sess-a", "result": "allowed"},
        id="minute-session-result-by-agent",
    ),
    pytest.param(
        "hour",
        None,
        {"session_id": "sess-b", "agent_id": 0, "from": t(0, 30, 30, 30), "to": t(4, 4, 4, 4)},
        id="hour-session-agent-range",
    ),
    pytest.param(
        "day",
        "result",
        {"tool_name": "calendar.read", "from": t(0, 1, 1, 1)},
        id="day-tool-from-by-result",
    ),
]


@pytest.mark.parametrize(("bucket", "group_by", "query"), STATS)
def test_stats_count_exactly_what_was_written(
    client, admin_headers, clock, spread, bucket, group_by, query
):
    asked = resolve(spread, query) | {"bucket": bucket}
    if group_by is not None:
        asked["group_by"] = group_by
    data = stats(client, admin_headers, **asked)
    now = clock.moment  # the request's reading of the clock: the default range ends there
    expected = expected_stats(spread.entries, spread, query, bucket, group_by, now)
    assert expected, "the case counts something"
    assert in_start_order(data) == expected


def test_stats_default_to_hours_over_the_last_day(client, admin_headers, clock, spread):
    data = stats(client, admin_headers)
    now = clock.moment
    assert in_start_order(data) == expected_stats(spread.entries, spread, {}, "hour", None, now)
    # the first bucket holds only what is inside the day: the entry at 12:00:00.5 the day
    # before, not the one at 12:00:00 (nor the one at 11:30); nothing after the clock
    assert data[0] == {"start": "2026-11-20T12:00:00.000000Z", "key": None, "count": 1}
    assert instant(data[-1]["start"]) <= now


def test_stats_up_to_the_first_instant_there_is_start_there(client, admin_headers, spread):
    """A ``to`` near year 1 and no ``from``: the day before it is cut at the first instant a
    date holds (it was a 500)."""
    response = client.get(
        "/v1/audit-logs/stats", query_string={"to": "0001-01-01T00:00:00Z"}, headers=admin_headers
    )
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.json["data"] == []


def test_stats_cover_the_whole_list(client, admin_headers, spread):
    """Summed over a range, the counts are the list's total of that range."""
    query = {"from": isoformat(t(0, 0, 0, 1)), "to": isoformat(t(5))}
    for bucket in ("minute", "hour", "day"):
        data = stats(client, admin_headers, bucket=bucket, **query)
        total = logs(client, admin_headers, limit=1, **query)["pagination"]["total"]
        assert sum(item["count"] for item in data) == total


@pytest.mark.parametrize(
    ("bucket", "since", "until", "status"),
    [
        pytest.param("minute", t(0), t(0) + 9_999 * MINUTE, 200, id="minute-10000-buckets"),
        pytest.param(
            "minute",
            t(0, 0, 30),
            t(0, 0, 59) + 9_999 * MINUTE,
            200,
            id="minute-10000-buckets-unaligned",
        ),
        pytest.param("minute", t(0), t(0) + 10_000 * MINUTE, 400, id="minute-10001-buckets"),
        pytest.param(
            "minute",
            t(0, 0, 59),
            t(0) + 9_999 * MINUTE + timedelta(seconds=1),
            200,
            id="minute-10000-buckets-by-a-second",
        ),
        pytest.param("minute", t(0), t(0) + 7 * DAY, 400, id="minute-a-week"),
        pytest.param("hour", t(0), t(0) + 9_999 * HOUR, 200, id="hour-10000-buckets"),
        pytest.param("hour", t(0, 59, 59), t(0) + 10_000 * HOUR, 400, id="hour-10001-buckets"),
        pytest.param("hour", t(0), t(0) + 800 * DAY, 400, id="hour-800-days"),
        pytest.param(
            "day",
            datetime(2000, 1, 1, tzinfo=UTC),
            datetime(2000, 1, 1, tzinfo=UTC) + 9_999 * DAY,
            200,
            id="day-10000-buckets",
        ),
        pytest.param(
            "day",
            datetime(1990, 1, 1, tzinfo=UTC),
            datetime(2026, 1, 1, tzinfo=UTC),
            400,
            id="day-36-years",
        ),
    ],
)
def test_stats_refuse_ranges_of_more_than_10000_buckets(
    client, admin_headers, spread, bucket, since, until, status
):
    query = {"bucket": bucket, "from": isoformat(since), "to": isoformat(until)}
    response = client.get("/v1/audit-logs/stats", query_string=query, headers=admin_headers)
    if status == 200:
        assert response.status_code == 200, response.get_data(as_text=True)
    else:
        assert_error(response, 400, "VALIDATION_ERROR")


@pytest.mark.parametrize(
    ("query", "field"),
    [
        pytest.param({"bucket": "week"}, "bucket", id="bucket-week"),
        pytest.param({"bucket": "Hour"}, "bucket", id="bucket-case"),
        pytest.param({"bucket": ""}, "bucket", id="bucket-empty"),
        pytest.param({"group_by": "session"}, "group_by", id="group-by-session"),
        pytest.param({"group_by": "action"}, "group_by", id="group-by-action"),
        pytest.param({"group_by": ""}, "group_by", id="group-by-empty"),
        pytest.param({"result": "maybe"}, "result", id="result-unknown"),
        pytest.param({"agent_id": "not-a-uuid"}, "agent_id", id="agent-malformed"),
        pytest.param({"from": "yesterday"}, "from", id="from-malformed"),
        pytest.param(
            {"from": "2026-11-21T10:00:00Z", "to": "2026-11-21T09:59:59.999999Z"},
            "from",
            id="from-after-to",
        ),
        pytest.param({"action": "authorize"}, "action", id="action-is-not-a-stats-filter"),
        pytest.param({"limit": "10"}, "limit", id="limit-is-not-a-stats-parameter"),
        pytest.param({"bucket": ["hour", "day"]}, "bucket", id="bucket-twice"),
    ],
)
def test_stats_refuse_bad_parameters(client, admin_headers, query, field):
    response = client.get("/v1/audit-logs/stats", query_string=query, headers=admin_headers)
    error = assert_error(response, 400, "VALIDATION_ERROR")
    assert field in [detail["field"] for detail in error["details"]], error


def test_stats_may_be_read_with_a_read_only_key(client, admin_headers, readonly_headers, spread):
    query = {
        "bucket": "minute",
        "group_by": "agent",
        "from": isoformat(t(1)),
        "to": isoformat(t(2)),
    }
    as_reader = stats(client, readonly_headers, **query)
    assert as_reader == stats(client, admin_headers, **query)
    assert as_reader


@pytest.mark.parametrize(
    ("bucket", "group_by", "query"),
    [
        pytest.param("hour", None, {}, id="hour"),
        pytest.param(
            "minute", "agent", {"from": t(1, 59, 30), "to": t(2, 20, 20)}, id="minute-by-agent"
        ),
        pytest.param("hour", "tool", {"session_id": "sess-a"}, id="hour-session-by-tool"),
        pytest.param("day", "result", {"agent_id": 1, "from": t(-8)}, id="day-agent-by-result"),
    ],
)
def test_stats_and_totals_never_count_another_workspaces_entries(
    app, client, admin_headers, clock, other_workspace, spread, bucket, group_by, query
):
    """Another workspace holds entries like ours (same agent ids, tools, sessions, instants)."""
    theirs = invent(spread.agents, [e.timestamp for e in spread.entries], seed=11, first_n=0)
    other_headers = other_workspace.headers("admin")  # makes the workspace
    record_audit_entries(app, (fields(other_workspace.id, e, exists=False) for e in theirs))
    asked = resolve(spread, query) | {"bucket": bucket}
    if group_by is not None:
        asked["group_by"] = group_by
    data = stats(client, admin_headers, **asked)
    expected = expected_stats(spread.entries, spread, query, bucket, group_by, clock.moment)
    assert in_start_order(data) == expected
    listed = logs(client, admin_headers, limit=1, **resolve(spread, query))
    assert listed["pagination"]["total"] == count(spread, query)
    # and on their side, theirs
    assert logs(client, other_headers, limit=1)["pagination"]["total"] == len(theirs)


@pytest.mark.parametrize(
    ("bucket", "group_by", "query"),
    [
        pytest.param("hour", "agent", {}, id="hour-by-agent"),
        pytest.param(
            "minute",
            None,
            {"agent_id": 0, "from": t(1, 17, 23, 456_789), "to": t(3, 3, 3, 3)},
            id="minute-deleted-agent",
        ),
        pytest.param("hour", "tool", {"session_id": "sess-a"}, id="hour-session-by-tool"),
        pytest.param(
            "day", "result", {"tool_name": "email.send", "from": t(-8)}, id="day-tool-by-result"
        ),
        pytest.param(
            "minute",
            "result",
            {"from": t(1, 59, 30), "to": t(2, 0, 20)},
            id="minute-under-a-minute-across-an-hour",
        ),
    ],
)
def test_stats_never_count_erased_entries(
    client, admin_headers, clock, spread, bucket, group_by, query
):
    asked = resolve(spread, query) | {"bucket": bucket}
    if group_by is not None:
        asked["group_by"] = group_by
    deleted = client.delete(f"/v1/agents/{spread.agents[0]}", headers=admin_headers)
    assert deleted.status_code == 204
    kept = [e for e in spread.entries if e.agent_id != spread.agents[0]]
    data = stats(client, admin_headers, **asked)
    assert in_start_order(data) == expected_stats(
        kept, spread, query, bucket, group_by, clock.moment
    )
    assert all(item["key"] != spread.agents[0] for item in data)
