"""The official SDK's current line, mcp 2.x: an ``MCPServer`` and a low-level ``Server`` guarded
in one line, driven by the SDK's own client connected in process. Runs in an environment of
its own (``nox -s mcp2``: mcp 2.x cannot share one with the 1.x line the main suite pins)."""

from __future__ import annotations

import dataclasses
import re
from typing import Annotated, Any

import pytest
from mcp import Client, types
from mcp.server.lowlevel import Server
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.resolve import Elicit, Resolve
from pydantic import BaseModel

from agentauth import AsyncAuthzClient, Guard
from tests.agentauth.cases import each_case, judge, stand_in

pytestmark = pytest.mark.anyio

KEY = "svc_" + "5" * 32


class Event(BaseModel):
    title: str
    attendees: int


def build_server(ran: list[str]) -> MCPServer:
    server = MCPServer("calendar")

    @server.tool(name="calendar.create")
    def create(title: str, attendees: int = 1) -> Event:
        ran.append("calendar.create")
        return Event(title=title, attendees=attendees)

    @server.tool()
    async def echo(text: str) -> str:
        ran.append("echo")
        return text

    @server.tool(name="payments.refund")
    def refund(amount: float, currency: str) -> str:
        ran.append("payments.refund")
        return f"refunded {amount} {currency}"

    @server.tool()
    def shell(cmd: str) -> str:
        ran.append("shell")
        return "ran " + cmd

    return server


def build_lowlevel_server(ran: list[str]) -> Server[Any]:
    async def list_tools(_ctx: Any, _params: Any) -> types.ListToolsResult:
        schema = {"type": "object", "properties": {"text": {"type": "string"}}}
        return types.ListToolsResult(tools=[types.Tool(name="echo", input_schema=schema)])

    async def call_tool(_ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        ran.append(params.name)
        text = (params.arguments or {})["text"]
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])

    return Server("lowlevel", on_list_tools=list_tools, on_call_tool=call_tool)


async def call(server: Any, tool: str, arguments: dict[str, Any]) -> Any:
    async with Client(server) as client:
        return await client.call_tool(tool, arguments)


def text_of(result: Any) -> str:
    return str(result.content[0].text)


@pytest.mark.parametrize(
    "build", [build_server, build_lowlevel_server], ids=["MCPServer", "Server"]
)
@each_case()
async def test_every_case_of_the_shared_table(case, on_error, build):
    ran: list[str] = []
    with stand_in(case) as base:
        client = AsyncAuthzClient(base, KEY, timeout=case.timeout)
        server = Guard(client, "agent", on_error=on_error).protect(build(ran))
        result = await call(server, "echo", {"text": "hi"})
    was_run = ran == ["echo"]
    assert result.is_error is (not was_run)
    if was_run:
        assert text_of(result) == "hi"
    judge(case, on_error, was_run, None if was_run else text_of(result), KEY)


ALLOWED = [
    ("calendar.create", {"title": "standup", "attendees": 3}),
    ("echo", {"text": "hello"}),
    ("payments.refund", {"amount": 25, "currency": "EUR"}),
]
DENIED = [
    ("calendar.delete_all", {}),
    ("shell", {"cmd": "rm -rf /"}),
    ("payments.refund", {"amount": 2500, "currency": "EUR"}),
]


@pytest.mark.parametrize(("tool", "arguments"), ALLOWED, ids=[t for t, _ in ALLOWED])
async def test_allowed_calls_answer_as_the_unguarded_server(
    service, api_key, agent_id, tool, arguments
):
    plain_ran: list[str] = []
    guarded_ran: list[str] = []
    expected = await call(build_server(plain_ran), tool, arguments)
    guard = Guard(AsyncAuthzClient(service, api_key), agent_id)
    got = await call(guard.protect(build_server(guarded_ran)), tool, arguments)
    assert got.is_error is False
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
    assert result.is_error is True
    assert [(c.type, c.text) for c in result.content] == [
        ("text", f"Authorization denied: {reason}")
    ]
    assert result.structured_content is None
    assert ran == []


async def test_each_call_is_checked_once_and_audited_once(
    service, api_key, agent_id, client, admin_headers
):
    """The middleware checks a call of the protocol; MCPServer's handler then calls its own
    call_tool, which a guard also wraps for calls made in process: not a second check."""
    server = Guard(AsyncAuthzClient(service, api_key), agent_id).protect(build_server([]))
    await call(server, "echo", {"text": "once"})
    entries = client.get(
        "/v1/audit-logs", query_string={"agent_id": agent_id}, headers=admin_headers
    ).json["data"]
    assert [e["toolName"] for e in entries] == ["echo"]


async def test_a_tool_added_after_protect_is_guarded(service, api_key, agent_id):
    ran: list[str] = []
    server = Guard(AsyncAuthzClient(service, api_key), agent_id).protect(build_server(ran))

    @server.tool(name="calendar.delete_all")
    def delete_all() -> str:
        ran.append("calendar.delete_all")
        return "deleted everything"

    result = await call(server, "calendar.delete_all", {})
    assert result.is_error is True
    assert text_of(result).startswith("Authorization denied: ")
    assert ran == []


async def test_calling_a_tool_in_process_is_guarded_too(service, api_key, agent_id):
    ran: list[str] = []
    server = Guard(AsyncAuthzClient(service, api_key), agent_id).protect(build_server(ran))
    denied = await server.call_tool("shell", {"cmd": "id"})
    allowed = await server.call_tool("echo", {"text": "hi"})
    assert denied.is_error is True
    assert text_of(denied).startswith("Authorization denied: ")
    assert ran == ["echo"]
    assert allowed is not None


async def test_protect_refuses_a_second_guard_and_other_objects():
    guard = Guard(AsyncAuthzClient("http://127.0.0.1:1", KEY), "agent")
    server = guard.protect(build_server([]))
    with pytest.raises(ValueError, match="already protected"):
        guard.protect(server)
    with pytest.raises(TypeError, match="an adapter for"):
        guard.protect(object())


async def test_a_call_rewritten_after_the_check_is_checked_as_it_runs(service, api_key, agent_id):
    """A middleware added after protect() sits inside the guard and may rewrite the call: the
    tool then runs with arguments nobody checked, unless MCPServer's own call_tool, which the
    guard also wraps, checks what actually reaches it."""
    ran: list[str] = []
    server = Guard(AsyncAuthzClient(service, api_key), agent_id).protect(build_server(ran))

    async def inflate(ctx: Any, call_next: Any) -> Any:
        if ctx.method == "tools/call":
            arguments = {**(ctx.params.get("arguments") or {}), "amount": 5000}
            ctx = dataclasses.replace(ctx, params={**ctx.params, "arguments": arguments})
        return await call_next(ctx)

    server.middleware.append(inflate)
    result = await call(server, "payments.refund", {"amount": 25, "currency": "EUR"})
    assert result.is_error is True
    assert text_of(result).startswith("Authorization denied: ")
    assert ran == []


class Confirm(BaseModel):
    ok: bool


def ask_to_confirm() -> Elicit[Confirm]:
    return Elicit("Really refund?", Confirm)


def build_asking_server(ran: list[int]) -> MCPServer:
    """A refund that asks the client to confirm first: a call of two rounds on 2026-07-28 (the
    server answers input_required; the client calls again with the answer)."""
    server = MCPServer("payments")

    @server.tool(name="payments.refund")
    def refund(
        amount: int, currency: str, confirm: Annotated[Confirm, Resolve(ask_to_confirm)]
    ) -> str:
        ran.append(amount)
        return f"refunded {amount} {currency}" if confirm.ok else "not refunded"

    return server


async def confirm(_ctx: Any, _params: Any) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"ok": True})


def audited(client: Any, admin_headers: dict[str, str], agent_id: str) -> list[str]:
    entries = client.get(
        "/v1/audit-logs", query_string={"agent_id": agent_id}, headers=admin_headers
    ).json["data"]
    return [e["result"] for e in entries]


async def test_a_call_of_several_rounds_is_one_decision(
    service, api_key, agent_id, client, admin_headers
):
    """The round answering the server's question is the call the service allowed, not a second
    one; a later round sent again on its own (a replay) is a new call, and asked about."""
    ran: list[int] = []
    server = Guard(AsyncAuthzClient(service, api_key), agent_id).protect(build_asking_server(ran))
    arguments = {"amount": 25, "currency": "EUR"}
    async with Client(server, elicitation_callback=confirm) as mcp:
        assert mcp.protocol_version == "2026-07-28"
        result = await mcp.call_tool("payments.refund", arguments)
        assert text_of(result) == "refunded 25 EUR"
        assert ran == [25]
        assert audited(client, admin_headers, agent_id) == ["allowed"]

        answers = {
            f"{__name__}:ask_to_confirm": types.ElicitResult(action="accept", content={"ok": True})
        }
        replay = await mcp.call_tool("payments.refund", arguments, input_responses=answers)
        assert text_of(replay) == "refunded 25 EUR"
    assert audited(client, admin_headers, agent_id) == ["allowed", "allowed"]


async def test_an_approved_call_of_several_rounds_runs_on_its_one_approval(
    service, approval_agent, approve, workspace, client, admin_headers
):
    """An escalated tool that asks the client a question: approved once, the call and its
    answering round run on that one approval (a second question would use it up and ask for
    another, and the call could never finish)."""
    ran: list[int] = []
    guard = Guard(AsyncAuthzClient(service, workspace.key("read-only")), approval_agent)
    server = guard.protect(build_asking_server(ran))
    arguments = {"amount": 5000, "currency": "EUR"}
    async with Client(server, elicitation_callback=confirm) as mcp:
        first = await mcp.call_tool("payments.refund", arguments)
        assert first.is_error is True
        pending = re.search(r"approval (\S+) is pending", text_of(first))
        assert pending is not None
        approve(pending.group(1))
        second = await mcp.call_tool("payments.refund", arguments)
    assert text_of(second) == "refunded 5000 EUR"
    assert ran == [5000]
