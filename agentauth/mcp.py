"""Every tool of an MCP server behind the guard, in one call: ``guard.protect(mcp)``.

For servers built on the official ``mcp`` Python SDK's ``FastMCP`` (``mcp`` 1.x, see the README
for the versions tested). The guard wraps the server's ``tools/call`` handler: each call is
checked with the tool's name and the arguments exactly as the MCP client sent them, before the
SDK validates or converts anything. A denied call answers ``isError: true`` with the text
``Authorization denied: <reason>`` (also for tools that declare a structured output: the
denial is not run through the tool's output schema) and never reaches the tool; an allowed call
goes to the SDK's own handler unchanged. Tools added after ``protect`` are guarded too: the
check is per call, keyed by name. ``server.call_tool`` (for code calling tools in-process) is
guarded the same way.

A call the service escalates to a human is denied the same way, with the text of
:mod:`agentauth.guard` (approval required, the approval's id and expiry, the service's reason);
a guard made with ``wait_for_approval`` first waits for the approval, then asks again, and the
tool runs only if that answer allows. The MCP request stays open while the guard waits: keep the
wait below the MCP client's request time-out.
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
    handlers = server._mcp_server.request_handlers
    handle_call = handlers.get(types.CallToolRequest)
    if handle_call is None:
        raise TypeError("this FastMCP server has no tools/call handler to guard")

    def denial(reason: str) -> types.CallToolResult:
        text = types.TextContent(type="text", text=DENIED_PREFIX + reason)
        return types.CallToolResult(content=[text], isError=True)

    async def guarded_request(request: types.CallToolRequest) -> Any:
        params = request.params
        decision = await guard.check_async(params.name, params.arguments or {})
        if not decision.allowed:
            return types.ServerResult(denial(decision.reason))
        return await handle_call(request)  # the SDK's own: validation, conversion, output

    call_tool = server.call_tool

    async def guarded_call_tool(name: str, arguments: dict[str, Any]) -> Any:
        """The same check for code that calls ``server.call_tool`` directly."""
        decision = await guard.check_async(name, arguments or {})
        if not decision.allowed:
            return denial(decision.reason)
        return await call_tool(name, arguments)

    # wrapping the registered handler keeps whatever options FastMCP registered it with
    handlers[types.CallToolRequest] = guarded_request
    server.call_tool = guarded_call_tool  # type: ignore[method-assign]
    setattr(server, _MARK, guard)
    return server
