"""An MCP server of the official SDK with every tool behind agentauth, in one line: mcp 2.x's
``MCPServer`` (with mcp 1.x, ``FastMCP``: the import below picks the one installed).

    KEY=svc_... AGENT_ID=... python examples/mcp_server.py          # two calls, then exit
    KEY=svc_... AGENT_ID=... python examples/mcp_server.py --serve  # serve over stdio

The two calls go through the SDK's own client, in process: ``calendar.create`` (allowed by a policy
that allows ``calendar.*``) and ``shell.exec`` (denied). ``AGENTAUTH_URL`` defaults to
http://127.0.0.1:8080."""

from __future__ import annotations

import asyncio
import os
import sys
from importlib.metadata import version
from typing import Any

from agentauth import AsyncAuthzClient, Guard

MCP_2 = version("mcp").startswith("2.")
if MCP_2:
    from mcp.server.mcpserver import MCPServer as Server
else:
    from mcp.server.fastmcp import FastMCP as Server  # type: ignore[assignment,no-redef]

mcp = Server("calendar")


@mcp.tool(name="calendar.create")
def create(title: str) -> str:
    return f"created {title}"


@mcp.tool(name="shell.exec")
def shell(cmd: str) -> str:
    return f"ran {cmd}"


service = os.environ.get("AGENTAUTH_URL", "http://127.0.0.1:8080")
Guard(AsyncAuthzClient(service, os.environ["KEY"]), os.environ["AGENT_ID"]).protect(mcp)

CALLS = [("calendar.create", {"title": "standup"}), ("shell.exec", {"cmd": "id"})]


async def demo() -> None:
    for tool, arguments in CALLS:
        result = await call(tool, arguments)
        print(f"{tool}: {result.content[0].text}")


async def call(tool: str, arguments: dict[str, Any]) -> Any:
    if MCP_2:
        from mcp import Client

        async with Client(mcp) as client:
            return await client.call_tool(tool, arguments)
    from mcp.shared.memory import create_connected_server_and_client_session

    async with create_connected_server_and_client_session(mcp._mcp_server) as session:
        return await session.call_tool(tool, arguments)


if __name__ == "__main__":
    if "--serve" in sys.argv:
        mcp.run()
    else:
        asyncio.run(demo())
