"""Every tool of a server built with the standalone ``fastmcp`` package (4.x) behind the guard,
in one call: ``guard.protect(mcp)``.

The guard is a FastMCP middleware (``on_call_tool``), not a wrapper of functions: every tool
call the server runs goes through it, whatever registered the tool and when, tools of servers
mounted on this one included (protect the server the clients connect to: a protected server
mounted in another protected one is checked by both, each under its own name for the tool).
Each call is checked with the tool's name and its arguments as
the client sent them. A denied call never reaches the tool: the client gets ``isError: true``
and the text ``Authorization denied: <reason>``, the text of :mod:`agentauth.guard` for an
escalation too (approval required, which approval, until when). A call of several rounds (a
tool that answers ``InputRequiredResult`` to ask the client for input) is one decision, as in
:mod:`agentauth.mcp`. Install with ``pip install 'agentauth[fastmcp]'``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from agentauth.guard import DENIED_PREFIX
from agentauth.mcp import SESSION_HEADER, Rounds, transport_session

if TYPE_CHECKING:
    from agentauth.guard import Guard

#: the attribute that marks a protected server (a second protect would check twice)
_MARK = "_agentauth_guard"


def protect(server: Any, guard: Guard) -> Any:
    """Guard every tool of ``server`` (a ``fastmcp.FastMCP``); returns ``server``."""
    try:
        # by name: the package is optional, and not installed where the main suite runs
        fastmcp: Any = importlib.import_module("fastmcp")
        middleware: Any = importlib.import_module("fastmcp.server.middleware")
        tools: Any = importlib.import_module("fastmcp.tools")
        addressing: Any = importlib.import_module("fastmcp.server.providers.addressing")
        types: Any = importlib.import_module("mcp_types")
        dependencies: Any = importlib.import_module("fastmcp.server.dependencies")
    except ImportError as exc:
        raise ImportError(
            f"agentauth.fastmcp needs fastmcp 4.x: pip install 'agentauth[fastmcp]' ({exc})"
        ) from None
    if not isinstance(server, fastmcp.FastMCP):
        raise TypeError(f"protect() takes a fastmcp.FastMCP, not {type(server).__name__}")
    if getattr(server, _MARK, None) is not None:
        raise ValueError("this server is already protected by a guard")

    rounds = Rounds()

    class Guarded(middleware.Middleware):  # type: ignore[misc]
        """Checks each tool call before the tool runs."""

        async def on_call_tool(self, context: Any, call_next: Any) -> Any:
            message = context.message
            arguments = message.arguments or {}
            answering = message.input_responses is not None or message.request_state
            if answering and rounds.take(message.name, arguments):
                return await self._run(context, call_next)
            # the MCP session of streamable HTTP, when the call came over it
            headers = dependencies.get_http_headers(include={SESSION_HEADER})
            session = transport_session(guard, headers)
            decision = await guard.check_async(message.name, arguments, session_id=session)
            hashed = addressing.parse_hashed_backend_name(message.name)
            if decision.allowed and hashed is not None:
                # fastmcp also runs an app's backend tool called as __<hash>_<name>: checked
                # under the tool's own name as well, so a policy on that name holds
                decision = await guard.check_async(hashed[1], arguments, session_id=session)
            if not decision.allowed:
                text = types.TextContent(type="text", text=DENIED_PREFIX + decision.reason)
                return tools.ToolResult(content=[text], is_error=True)
            return await self._run(context, call_next)

        @staticmethod
        async def _run(context: Any, call_next: Any) -> Any:
            result = await call_next(context)
            if isinstance(result, tools.InputRequiredToolResult):
                rounds.admit(context.message.name, context.message.arguments or {})
            return result

    server.add_middleware(Guarded())
    setattr(server, _MARK, guard)
    return server
