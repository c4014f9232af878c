"""A server of the standalone ``fastmcp`` package (4.x) with every tool behind agentauth, in one
line (a FastMCP middleware: tools added later and mounted servers' tools are guarded too).

    KEY=svc_... AGENT_ID=... python examples/fastmcp_server.py          # two calls, then exit
    KEY=svc_... AGENT_ID=... python examples/fastmcp_server.py --serve  # serve over stdio

The two calls go through FastMCP's own client, in process: ``calendar.create`` (allowed by a policy
that allows ``calendar.*``) and ``shell.exec`` (denied)."""

from __future__ import annotations

import asyncio
import os
import sys

from fastmcp import Client, FastMCP

from agentauth import AsyncAuthzClient, Guard

mcp = FastMCP("calendar")


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
    async with Client(mcp) as client:
        for tool, arguments in CALLS:
            result = await client.call_tool(tool, arguments, raise_on_error=False)
            print(f"{tool}: {result.content[0].text}")


if __name__ == "__main__":
    if "--serve" in sys.argv:
        mcp.run()
    else:
        asyncio.run(demo())
