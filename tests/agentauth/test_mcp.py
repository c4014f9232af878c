"""A FastMCP server guarded in one line, driven by the mcp SDK's own in-memory client session:
denied calls answer the exact denial text with isError, for plain and structured tools alike,
and allowed calls answer exactly what the unguarded server answers."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import uvicorn
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client
from mcp.server.fastmcp import FastMCP
from mcp.server.lowlevel import Server
from mcp.shared.memory import create_connected_server_and_client_session
from pydantic import BaseModel

from agentauth import AsyncAuthzClient, AuthzClient, Guard
from tests.agentauth.cases import each_case, judge, stand_in
from tests.agentauth.faults import faulty_service
from tests.api.helpers import make_agent
from tests.server import WAIT_SECONDS, wait_for

pytestmark = pytest.mark.anyio


class Event(BaseModel):
    title: str
    attendees: int


def build_server(ran: list[str]) -> FastMCP:
    """The same tools every time: text, int and pydantic results; ``ran`` records the calls
    that reached a tool."""
    server = FastMCP("calendar")

    @server.tool(name="calendar.create")
    def create(title: str, attendees: int = 1) -> Event:
        ran.append("calendar.create")
        return Event(title=title, attendees=attendees)

    @server.tool(name="calendar.delete_all")
    def delete_all() -> str:
        ran.append("calendar.delete_all")
        return "deleted everything"

    @server.tool()
    async def echo(text: str) -> str:
        ran.append("echo")
        return text

    @server.tool()
    def add(a: int, b: int) -> int:
        ran.append("add")
        return a + b

    @server.tool(name="payments.refund")
    def refund(amount: float, currency: str) -> str:
        ran.append("payments.refund")
        return f"refunded {amount} {currency}"

    @server.tool()
    def shell(cmd: str) -> str:
        ran.append("shell")
        return "ran " + cmd

    return server


async def call(server: FastMCP, tool: str, arguments: dict[str, Any]) -> Any:
    async with create_connected_server_and_client_session(server._mcp_server) as session:
        return await session.call_tool(tool, arguments)


ALLOWED = [
    ("calendar.create", {"title": "standup", "attendees": 3}),
    ("echo", {"text": "hello"}),
    ("add", {"a": 2, "b": 40}),
    ("payments.refund", {"amount": 25, "currency": "EUR"}),
]
DENIED = [
    ("calendar.delete_all", {}),
    ("shell", {"cmd": "rm -rf /"}),
    ("payments.refund", {"amount": 2500, "currency": "EUR"}),
]

CLIENTS: dict[str, Callable[[str, str], Any]] = {
    "async-client": AsyncAuthzClient,
    "sync-client": AuthzClient,
}


@pytest.mark.parametrize("client_kind", CLIENTS.values(), ids=CLIENTS.keys())
@pytest.mark.parametrize(("tool", "arguments"), ALLOWED, ids=[t for t, _ in ALLOWED])
async def test_allowed_calls_answer_as_the_unguarded_server(
    service, api_key, agent_id, client_kind, tool, arguments
):
    plain_ran: list[str] = []
    guarded_ran: list[str] = []
    plain = build_server(plain_ran)
    guarded = Guard(client_kind(service, api_key), agent_id).protect(build_server(guarded_ran))
    expected = await call(plain, tool, arguments)
    got = await call(guarded, tool, arguments)
    assert got.isError is False
    assert got.model_dump() == expected.model_dump()
    assert guarded_ran == plain_ran == [tool]


@pytest.mark.parametrize(("tool", "arguments"), DENIED, ids=[t for t, _ in DENIED])
async def test_denied_calls_answer_the_exact_denial_and_never_run(
    service, api_key, agent_id, tool, arguments
):
    ran: list[str] = []
    client = AsyncAuthzClient(service, api_key)
    server = Guard(client, agent_id).protect(build_server(ran))
    result = await call(server, tool, arguments)
    reason = (await client.authorize(agent_id, tool, arguments)).reason
    assert result.isError is True
    assert [(c.type, c.text) for c in result.content] == [
        ("text", f"Authorization denied: {reason}")
    ]
    assert result.structuredContent is None
    assert ran == []


async def test_a_structured_tool_denied_still_answers_the_denial_text(
    service, api_key, agent_id, client, admin_headers
):
    """calendar.create returns a pydantic model (an output schema); deny it with a policy of
    higher priority and the MCP client still gets the plain denial, not a schema error."""
    body = {
        "agent_id": agent_id,
        "name": "no-meetings-today",
        "priority": 100,
        "rules": [{"type": "tool_denylist", "tools": ["calendar.create"]}],
    }
    assert client.post("/v1/policies", json=body, headers=admin_headers).status_code == 201
    ran: list[str] = []
    authz = AsyncAuthzClient(service, api_key)
    server = Guard(authz, agent_id).protect(build_server(ran))
    tools = {t.name: t for t in (await _list_tools(server))}
    assert tools["calendar.create"].outputSchema is not None
    arguments = {"title": "x", "attendees": 2}
    result = await call(server, "calendar.create", arguments)
    decision = await authz.authorize(agent_id, "calendar.create", arguments)
    assert decision.allowed is False
    assert decision.rule_index == 0
    assert result.isError is True
    assert [(c.type, c.text) for c in result.content] == [
        ("text", f"Authorization denied: {decision.reason}")
    ]
    assert result.structuredContent is None
    assert ran == []


async def _list_tools(server: FastMCP) -> list[Any]:
    async with create_connected_server_and_client_session(server._mcp_server) as session:
        return list((await session.list_tools()).tools)


async def test_an_unreachable_service_denies_every_tool_by_default(agent_id):
    from tests.server import free_port

    ran: list[str] = []
    unreachable = AsyncAuthzClient(f"http://127.0.0.1:{free_port()}", "svc_" + "1" * 32)
    server = Guard(unreachable, agent_id).protect(build_server(ran))
    result = await call(server, "echo", {"text": "hi"})
    assert result.isError is True
    assert result.content[0].text.startswith(
        "Authorization denied: authorization service unreachable"
    )
    assert ran == []


async def test_protect_refuses_a_second_guard_and_other_objects(agent_id):
    guard = Guard(AsyncAuthzClient("http://127.0.0.1:1", "svc_" + "2" * 32), agent_id)
    server = guard.protect(build_server([]))
    with pytest.raises(ValueError, match="already protected"):
        guard.protect(server)
    with pytest.raises(TypeError, match="an adapter for"):
        guard.protect(object())


async def test_a_refused_key_denies_every_tool_even_with_on_error_allow(agent_id):
    ran: list[str] = []
    refusal = b'{"error": {"code": "UNAUTHORIZED", "message": "invalid API key"}}'
    with faulty_service(401, refusal) as (base, received):
        guard = Guard(AsyncAuthzClient(base, "svc_" + "3" * 32), agent_id, on_error="allow")
        server = guard.protect(build_server(ran))
        result = await call(server, "echo", {"text": "hi"})
    assert len(received) == 1
    assert result.isError is True
    assert result.content[0].text.startswith(
        "Authorization denied: the authorization service refused"
    )
    assert ran == []


async def test_calling_a_tool_in_process_is_guarded_too(service, api_key, agent_id):
    ran: list[str] = []
    server = Guard(AsyncAuthzClient(service, api_key), agent_id).protect(build_server(ran))
    denied = await server.call_tool("shell", {"cmd": "id"})
    allowed = await server.call_tool("echo", {"text": "hi"})
    assert denied.isError is True
    assert denied.content[0].text.startswith("Authorization denied: ")
    assert ran == ["echo"]
    assert allowed is not None


TABLE_KEY = "svc_" + "4" * 32


@each_case()
async def test_every_case_of_the_shared_table(case, on_error):
    """conformance/guard-cases.yaml, through a FastMCP server and the SDK's own client."""
    ran: list[str] = []
    with stand_in(case) as base:
        client = AsyncAuthzClient(base, TABLE_KEY, timeout=case.timeout)
        server = Guard(client, "agent", on_error=on_error).protect(build_server(ran))
        result = await call(server, "echo", {"text": "hi"})
    was_run = ran == ["echo"]
    assert result.isError is (not was_run)
    judge(case, on_error, was_run, None if was_run else result.content[0].text, TABLE_KEY)


def build_lowlevel_server(ran: list[str]) -> Server:
    """The SDK's low-level Server, with its one tools/call handler."""
    server = Server("lowlevel")

    @server.list_tools()
    async def list_tools() -> list[types.Tool]:
        schema = {"type": "object", "properties": {"text": {"type": "string"}}}
        return [types.Tool(name="echo", description="echo", inputSchema=schema)]

    @server.call_tool()
    async def call_tool(name: str, arguments: dict[str, Any]) -> list[types.TextContent]:
        ran.append(name)
        return [types.TextContent(type="text", text=arguments["text"])]

    return server


@each_case()
async def test_every_case_of_the_shared_table_on_a_lowlevel_server(case, on_error):
    ran: list[str] = []
    with stand_in(case) as base:
        client = AsyncAuthzClient(base, TABLE_KEY, timeout=case.timeout)
        server = Guard(client, "agent", on_error=on_error).protect(build_lowlevel_server(ran))
        async with create_connected_server_and_client_session(server) as session:
            result = await session.call_tool("echo", {"text": "hi"})
    was_run = ran == ["echo"]
    assert result.isError is (not was_run)
    if was_run:
        assert result.content[0].text == "hi"
    judge(case, on_error, was_run, None if was_run else result.content[0].text, TABLE_KEY)


async def test_a_lowlevel_server_without_its_call_handler_is_refused():
    guard = Guard(AsyncAuthzClient("http://127.0.0.1:1", TABLE_KEY), "agent")
    with pytest.raises(TypeError, match="before protect"):
        guard.protect(Server("empty"))


async def test_a_server_class_of_the_applications_own_is_guarded():
    """protect() finds the adapter through the class's lineage: a subclass of FastMCP defined
    here (in a tests module) is still a FastMCP."""

    class CalendarServer(FastMCP):
        pass

    ran: list[str] = []
    deny = b'{"allowed": false, "outcome": "denied", "reason": "no"}'
    with faulty_service(200, deny) as (base, _received):
        server = CalendarServer("calendar")

        @server.tool()
        def echo(text: str) -> str:
            ran.append(text)
            return text

        Guard(AsyncAuthzClient(base, TABLE_KEY), "agent").protect(server)
        result = await call(server, "echo", {"text": "hi"})
    assert result.isError is True
    assert ran == []


@contextmanager
def served_over_http(server: FastMCP) -> Iterator[str]:
    """``server`` over streamable HTTP (sessions on, as the SDK's default) on a free port of
    127.0.0.1, in a thread; yields its MCP URL and stops it on exit."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    config = uvicorn.Config(server.streamable_http_app(), log_level="warning", lifespan="on")
    http = uvicorn.Server(config)
    thread = threading.Thread(target=http.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    try:
        wait_for("the MCP server to start", lambda: http.started)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        http.should_exit = True
        thread.join(timeout=WAIT_SECONDS)
        listener.close()


def echo_agent(client: Any, headers: dict[str, str], *, max_calls: int, window: int) -> str:
    """An agent that may call echo, at most ``max_calls`` times per session per ``window``."""
    limit = {"maxCalls": max_calls, "windowSeconds": window}
    rules = [
        {"type": "rate_limit", "per": "session", "rateLimit": limit},
        {"type": "tool_allowlist", "tools": ["echo"]},
    ]
    return make_agent(client, headers, "chat-bot", rules)


async def echo_twice(url: str) -> tuple[str | None, list[bool]]:
    """One MCP session: its id and whether each of two echo calls ran."""
    async with (
        streamable_http_client(url) as (read, write, session_id),
        ClientSession(read, write) as mcp,
    ):
        await mcp.initialize()
        results = [await mcp.call_tool("echo", {"text": "hi"}) for _ in range(2)]
        return session_id(), [not r.isError for r in results]


async def test_each_mcp_session_has_its_own_per_session_limits(
    service, api_key, client, admin_headers
):
    """Over streamable HTTP the guard names the transport's MCP session in each call: a rate
    limit per session of one call lets each session make one, and the audit log names them."""
    agent_id = echo_agent(client, admin_headers, max_calls=1, window=3600)
    guard = Guard(AsyncAuthzClient(service, api_key), agent_id)
    with served_over_http(guard.protect(build_server([]))) as url:
        first_id, first = await echo_twice(url)
        second_id, second = await echo_twice(url)
    assert first == second == [True, False]
    assert first_id is not None
    assert second_id not in (None, first_id)
    entries = client.get(
        "/v1/audit-logs", query_string={"agent_id": agent_id}, headers=admin_headers
    ).json["data"]
    assert [e["sessionId"] for e in reversed(entries)] == [first_id] * 2 + [second_id] * 2


async def test_without_a_transport_session_the_guards_own_applies(
    service, api_key, client, admin_headers
):
    """In memory there is no MCP session: the guard's session_id names the calls, and without
    one a per-session rule denies ("session required")."""
    agent_id = echo_agent(client, admin_headers, max_calls=5, window=60)
    authz = AsyncAuthzClient(service, api_key)
    for session_id, runs in (("run-7", True), (None, False)):
        server = Guard(authz, agent_id, session_id=session_id).protect(build_server([]))
        async with create_connected_server_and_client_session(server._mcp_server) as mcp:
            result = await mcp.call_tool("echo", {"text": "hi"})
        assert result.isError is (not runs)
        if not runs:
            assert result.content[0].text.endswith("(rate_limit): session required")
    entries = client.get(
        "/v1/audit-logs", query_string={"agent_id": agent_id}, headers=admin_headers
    ).json["data"]
    assert [e["sessionId"] for e in reversed(entries)] == ["run-7", None]


async def test_the_guards_own_session_names_every_call_whatever_the_client_sends(
    service, api_key, client, admin_headers
):
    """Whoever runs the server set the guard's session_id: an MCP client cannot undo it by
    opening sessions (or, on stateless HTTP, sending ids of its choice)."""
    agent_id = echo_agent(client, admin_headers, max_calls=1, window=3600)
    guard = Guard(AsyncAuthzClient(service, api_key), agent_id, session_id="run-1")
    with served_over_http(guard.protect(build_server([]))) as url:
        _first_id, first = await echo_twice(url)
        _second_id, second = await echo_twice(url)
    assert first == [True, False]
    assert second == [False, False]  # the run's one call is spent, whatever the MCP session
    entries = client.get(
        "/v1/audit-logs", query_string={"agent_id": agent_id}, headers=admin_headers
    ).json["data"]
    assert {e["sessionId"] for e in entries} == {"run-1"}
