"""The standalone ``fastmcp`` package (4.x, which runs on mcp 2.x): a server guarded in one line
through FastMCP's own middleware, driven by FastMCP's own client in process. Tools registered
after ``protect`` and tools of a mounted server are guarded too. Runs in the mcp 2 environment
(``nox -s mcp2``)."""

from __future__ import annotations

import re
from typing import Any

import mcp_types
import pytest
from fastmcp import Client, Context, FastMCP

from agentauth import AsyncAuthzClient, Guard
from tests.agentauth.cases import each_case, judge, stand_in

pytestmark = pytest.mark.anyio

KEY = "svc_" + "6" * 32


def build_server(ran: list[str]) -> FastMCP:
    server = FastMCP("calendar")

    @server.tool(name="calendar.create")
    def create(title: str, attendees: int = 1) -> dict[str, Any]:
        ran.append("calendar.create")
        return {"title": title, "attendees": attendees}

    @server.tool()
    async def echo(text: str) -> str:
        ran.append("echo")
        return text

    @server.tool()
    def shell(cmd: str) -> str:
        ran.append("shell")
        return "ran " + cmd

    return server


async def call(server: FastMCP, tool: str, arguments: dict[str, Any]) -> Any:
    async with Client(server) as client:
        return await client.call_tool(tool, arguments, raise_on_error=False)


def text_of(result: Any) -> str:
    return str(result.content[0].text)


@each_case()
async def test_every_case_of_the_shared_table(case, on_error):
    ran: list[str] = []
    with stand_in(case) as base:
        client = AsyncAuthzClient(base, KEY, timeout=case.timeout)
        server = Guard(client, "agent", on_error=on_error).protect(build_server(ran))
        result = await call(server, "echo", {"text": "hi"})
    was_run = ran == ["echo"]
    assert result.is_error is (not was_run)
    if was_run:
        assert text_of(result) == "hi"
    judge(case, on_error, was_run, None if was_run else text_of(result), KEY)


async def test_allowed_calls_answer_as_the_unguarded_server(service, api_key, agent_id):
    plain_ran: list[str] = []
    guarded_ran: list[str] = []
    arguments = {"title": "standup", "attendees": 3}
    expected = await call(build_server(plain_ran), "calendar.create", arguments)
    guard = Guard(AsyncAuthzClient(service, api_key), agent_id)
    got = await call(guard.protect(build_server(guarded_ran)), "calendar.create", arguments)
    assert got.is_error is False
    assert (got.content, got.structured_content) == (expected.content, expected.structured_content)
    assert guarded_ran == plain_ran == ["calendar.create"]


async def test_a_denied_call_answers_the_exact_denial_and_never_runs(service, api_key, agent_id):
    ran: list[str] = []
    client = AsyncAuthzClient(service, api_key)
    server = Guard(client, agent_id).protect(build_server(ran))
    result = await call(server, "shell", {"cmd": "rm -rf /"})
    reason = (await client.authorize(agent_id, "shell", {"cmd": "rm -rf /"})).reason
    assert result.is_error is True
    assert text_of(result) == f"Authorization denied: {reason}"
    assert ran == []


async def test_tools_added_later_and_mounted_ones_are_guarded(service, api_key, agent_id):
    ran: list[str] = []
    server = Guard(AsyncAuthzClient(service, api_key), agent_id).protect(build_server(ran))

    @server.tool(name="calendar.delete_all")
    def delete_all() -> str:
        ran.append("calendar.delete_all")
        return "deleted everything"

    other = FastMCP("ops")

    @other.tool()
    def reboot() -> str:
        ran.append("reboot")
        return "rebooting"

    server.mount(other, namespace="ops")
    for tool in ("calendar.delete_all", "ops_reboot"):
        result = await call(server, tool, {})
        assert result.is_error is True, tool
        assert text_of(result).startswith("Authorization denied: "), tool
    assert ran == []


async def test_protect_refuses_a_second_guard():
    guard = Guard(AsyncAuthzClient("http://127.0.0.1:1", KEY), "agent")
    server = guard.protect(build_server([]))
    with pytest.raises(ValueError, match="already protected"):
        guard.protect(server)


async def test_an_app_tool_called_by_its_hashed_alias_is_checked_as_itself(
    service, api_key, client, admin_headers
):
    """fastmcp runs an app's backend tool called as __<hash>_<name> too: a policy that denies
    the tool by its name (and allows the rest) holds for the alias as well."""
    from fastmcp import FastMCPApp
    from fastmcp.server.providers.addressing import hashed_backend_name

    agent = client.post("/v1/agents", json={"name": "shop-bot"}, headers=admin_headers)
    rules = [
        {"type": "tool_denylist", "tools": ["issue_refund"]},
        {"type": "tool_allowlist", "tools": ["*"]},
    ]
    body = {"agent_id": agent.json["id"], "name": "no-refunds", "rules": rules}
    assert client.post("/v1/policies", json=body, headers=admin_headers).status_code == 201
    ran: list[int] = []
    app = FastMCPApp("shop")

    @app.tool(model=True)
    def issue_refund(amount: int) -> str:
        ran.append(amount)
        return f"refunded {amount}"

    server = FastMCP("shop-server")
    server.add_provider(app)
    Guard(AsyncAuthzClient(service, api_key), agent.json["id"]).protect(server)
    for name in ("issue_refund", hashed_backend_name("shop", "issue_refund")):
        result = await call(server, name, {"amount": 1_000_000})
        assert result.is_error is True, name
        assert text_of(result).startswith("Authorization denied: "), name
    assert ran == []


def build_asking_server(legs: list[int]) -> FastMCP:
    """A refund that asks the client to confirm first (fastmcp's guard pattern: the tool
    answers InputRequiredResult, and runs again with the client's answer)."""
    server = FastMCP("payments")
    question = mcp_types.ElicitRequest(
        params=mcp_types.ElicitRequestFormParams(
            message="Really refund?",
            requested_schema={"type": "object", "properties": {"ok": {"type": "boolean"}}},
        )
    )

    @server.tool(name="payments.refund")
    def refund(amount: int, currency: str, ctx: Context) -> str | mcp_types.InputRequiredResult:
        legs.append(amount)
        if not ctx.input_responses:
            return mcp_types.InputRequiredResult(input_requests={"confirm": question})
        return f"refunded {amount} {currency}"

    return server


async def confirm(_message: str, _type: Any, _params: Any, _ctx: Any) -> dict[str, bool]:
    return {"ok": True}


async def test_a_call_of_several_rounds_is_one_decision(
    service, api_key, agent_id, client, admin_headers
):
    legs: list[int] = []
    server = Guard(AsyncAuthzClient(service, api_key), agent_id).protect(build_asking_server(legs))
    async with Client(server, elicitation_handler=confirm) as mcp:
        result = await mcp.call_tool("payments.refund", {"amount": 25, "currency": "EUR"})
    assert text_of(result) == "refunded 25 EUR"
    assert legs == [25, 25]  # asked, then answered
    entries = client.get(
        "/v1/audit-logs", query_string={"agent_id": agent_id}, headers=admin_headers
    ).json["data"]
    assert [e["result"] for e in entries] == ["allowed"]


async def test_an_approved_call_of_several_rounds_runs_on_its_one_approval(
    service, approval_agent, approve, workspace
):
    legs: list[int] = []
    guard = Guard(AsyncAuthzClient(service, workspace.key("read-only")), approval_agent)
    server = guard.protect(build_asking_server(legs))
    arguments = {"amount": 5000, "currency": "EUR"}
    async with Client(server, elicitation_handler=confirm) as mcp:
        first = await mcp.call_tool("payments.refund", arguments, raise_on_error=False)
        assert first.is_error is True
        pending = re.search(r"approval (\S+) is pending", text_of(first))
        assert pending is not None
        approve(pending.group(1))
        second = await mcp.call_tool("payments.refund", arguments, raise_on_error=False)
    assert text_of(second) == "refunded 5000 EUR"
    assert legs == [5000, 5000]
