"""Every tool of an MCP server behind the guard, in one call: ``guard.protect(mcp)``.

For servers built on the official ``mcp`` Python SDK's ``FastMCP`` (``mcp`` 1.x, see the README
for the versions tested). The guard takes the server's ``tools/call`` handler: each call is
checked with the tool's name and the arguments exactly as the MCP client sent them, before the
SDK validates or converts anything. A denied call answers ``isError: true`` with the text
``Authorization denied: <reason>`` (also for tools that declare a structured output: the
denial is not run through the tool's output schema) and never reaches the tool; an allowed call
goes to the SDK's own handler unchanged. Tools added after ``protect`` are guarded too: the
check is per call, keyed by name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentauth.guard import DENIED_PREFIX

if TYPE_CHECKING:
    from agentauth.guard import Guard

#: the attribute that marks a protected server (a second protect would check twice)
_MARK = "_agentauth_guard"


def protect(server: Any, guard: Guard) -> Any:
    """Guard every tool of ``server`` (a ``FastMCP``); returns ``server``."""
    try:
        from mcp import types
        from mcp.server.fastmcp import FastMCP
    except ImportError as exc:  # mcp 2 removed FastMCP; or mcp is not installed
        raise ImportError(
            "agentauth.mcp needs the mcp SDK 1.x with FastMCP: pip install 'agentauth[mcp]' "
            f"({exc})"
        ) from None
    if not isinstance(server, FastMCP):
        raise TypeError(f"protect() takes a FastMCP server, not {type(server).__name__}")
    if getattr(server, _MARK, None) is not None:
        raise ValueError("this server is already protected by a guard")
    call_tool = server.call_tool  # the SDK's own: validation, conversion, structured output

    async def guarded_call_tool(name: str, arguments: dict[str, Any] | None) -> Any:
        decision = await guard.check_async(name, arguments or {})
        if not decision.allowed:
            text = types.TextContent(type="text", text=DENIED_PREFIX + decision.reason)
            return types.CallToolResult(content=[text], isError=True)
        return await call_tool(name, arguments or {})

    # FastMCP registered its call_tool with this same decorator and these options
    server._mcp_server.call_tool(validate_input=False)(guarded_call_tool)
    setattr(server, _MARK, guard)
    return server
