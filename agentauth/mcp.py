"""Every tool of an MCP server behind the guard, in one call: ``guard.protect(mcp)``.

For servers built on the official ``mcp`` Python SDK, both lines (see the README for the
versions tested): mcp 2.x's ``MCPServer`` and low-level ``Server``, where the guard is a
middleware of the server's chain; mcp 1.x's ``FastMCP`` and low-level ``Server``, where it wraps
the ``tools/call`` handler. Either way each call is checked with the tool's name and the
arguments exactly as the MCP client sent them, before the SDK validates or converts anything.
A denied call answers ``isError: true`` with the text
``Authorization denied: <reason>`` (also for tools that declare a structured output: the
denial is not run through the tool's output schema) and never reaches the tool; an allowed call
goes to the SDK's own handler unchanged. Tools added after ``protect`` are guarded too: the
check is per call, keyed by name. ``server.call_tool`` (for code calling tools in-process) is
guarded the same way.

A call of several rounds (MCP 2026-07-28: the server answers ``input_required`` to ask the
client for input, and the client calls again with the answers) is one decision: the first
round's. A round that carries the client's answers for the same tool and arguments, after an
allowed round that asked, within :data:`ROUND_SECONDS`, goes on without a second question
(which would count the call twice against rate limits and ask for a second approval); each
allowed round that asks admits one such round, once.

A guard made with a ``session_id`` names every call with it. Without one, each call names the MCP
session its transport negotiated (the ``mcp-session-id`` of streamable HTTP), so per-session
rate limits and budgets count per MCP session; calls without (stdio, in memory) name none. A
client may open as many sessions as it likes (and on stateless HTTP may send any id): what one
client may do in all is bounded by per-agent limits, not per-session ones.

A call the service escalates to a human is denied the same way, with the text of
:mod:`agentauth.guard` (approval required, the approval's id and expiry, the service's reason);
a guard made with ``wait_for_approval`` first waits for the approval, then asks again, and the
tool runs only if that answer allows. The MCP request stays open while the guard waits: keep the
wait below the MCP client's request time-out.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from agentauth.guard import DENIED_PREFIX

if TYPE_CHECKING:
    from agentauth.guard import Guard

#: the attribute that marks a protected server (a second protect would check twice)
_MARK = "_agentauth_guard"
#: the tool and arguments a call of the protocol was checked for, while the SDK runs it (mcp 2.x)
_CHECKED: ContextVar[tuple[str, Any] | None] = ContextVar("agentauth_mcp_checked", default=None)


#: the header in which streamable HTTP carries the MCP session's id
SESSION_HEADER = "mcp-session-id"
#: what a session id the service takes looks like (and an MCP session id is: visible ASCII)
_SESSION_ID = re.compile(r"[\x20-\x7e]{1,255}")


def transport_session(guard: Guard, headers: Mapping[str, str] | None) -> str | None:
    """The session a call names: None when the guard has its own (which then applies), else
    the MCP session id in the headers of the HTTP request the call came in (None without one:
    stdio, in memory, or an id the service could not take)."""
    if guard.session_id is not None:  # set by whoever runs the server: a client cannot undo it
        return None
    value = None if headers is None else headers.get(SESSION_HEADER)
    return value if isinstance(value, str) and _SESSION_ID.fullmatch(value) else None


#: how long after an allowed round that asked the client for input its next round is admitted
ROUND_SECONDS = 600.0


class Rounds:
    """The later rounds of multi-round tool calls that an allowed round admitted: for each tool
    and arguments, when each admission ends. An admission is used once; the oldest calls go
    first past ``kept``."""

    def __init__(self, kept: int = 10_000) -> None:
        self._open: OrderedDict[tuple[str, str], list[float]] = OrderedDict()
        self._kept = kept
        self._lock = threading.Lock()

    @staticmethod
    def _key(name: str, arguments: Mapping[str, Any]) -> tuple[str, str]:
        return name, json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=repr)

    def admit(self, name: str, arguments: Mapping[str, Any]) -> None:
        """An allowed round of this call asked the client for input: admit its next round."""
        key = self._key(name, arguments)
        with self._lock:
            self._open.setdefault(key, []).append(time.monotonic() + ROUND_SECONDS)
            self._open.move_to_end(key)
            while len(self._open) > self._kept:
                self._open.popitem(last=False)

    def take(self, name: str, arguments: Mapping[str, Any]) -> bool:
        """Whether a round answering the client's input for this call was admitted (used up)."""
        key = self._key(name, arguments)
        now = time.monotonic()
        with self._lock:
            ends = [end for end in self._open.pop(key, []) if end > now]
            taken = bool(ends)
            if len(ends) > 1:
                self._open[key] = ends[1:]
        return taken


def protect(server: Any, guard: Guard) -> Any:
    """Guard every tool of ``server``; returns ``server``. mcp 2.x: an ``MCPServer`` or a
    low-level ``Server``; mcp 1.x: a ``FastMCP`` or a low-level ``Server`` with its
    ``tools/call`` handler registered."""
    if getattr(server, _MARK, None) is not None:
        raise ValueError("this server is already protected by a guard")
    if importlib.util.find_spec("mcp.server.mcpserver") is None:  # mcp 1.x
        return _protect_v1(server, guard)
    return _protect_v2(server, guard)


def _protect_v2(server: Any, guard: Guard) -> Any:
    """mcp 2.x: a middleware on the server's chain, which sees every ``tools/call`` before the
    SDK validates its parameters or looks the tool up, whatever registered the tool and when
    (tools added after ``protect`` are guarded too)."""
    # by name: this module is type-checked against one major of the SDK, and runs on both
    types: Any = importlib.import_module("mcp.types")
    Server: Any = importlib.import_module("mcp.server.lowlevel").Server  # noqa: N806
    MCPServer: Any = importlib.import_module("mcp.server.mcpserver").MCPServer  # noqa: N806

    if not isinstance(server, MCPServer | Server):
        raise TypeError(
            f"protect() takes an MCPServer or a low-level Server, not {type(server).__name__}"
        )

    is_input_required = importlib.import_module("mcp_types.methods").is_input_required
    rounds = Rounds()

    def denial(reason: str) -> Any:
        text = types.TextContent(type="text", text=DENIED_PREFIX + reason)
        return types.CallToolResult(content=[text], is_error=True)

    async def guarded(ctx: Any, call_next: Any) -> Any:
        if ctx.method != "tools/call" or ctx.request_id is None:
            return await call_next(ctx)
        params = ctx.params or {}
        name, arguments = params.get("name"), params.get("arguments")
        if not isinstance(name, str) or not isinstance(arguments, dict | None):
            return await call_next(ctx)  # malformed: the SDK refuses it, no tool runs
        arguments = arguments or {}
        answering = params.get("inputResponses") is not None or params.get("requestState")
        if not (answering and rounds.take(name, arguments)):
            session = transport_session(guard, getattr(ctx.request, "headers", None))
            decision = await guard.check_async(name, arguments, session_id=session)
            if not decision.allowed:
                return denial(decision.reason)
        # MCPServer's handler calls call_tool: checked once, unless what reaches it differs (a
        # middleware inside this one rewrote the call): then it is checked as it is
        checked = _CHECKED.set((name, arguments))
        try:
            result = await call_next(ctx)
        finally:
            _CHECKED.reset(checked)
        if is_input_required(result):
            rounds.admit(name, arguments)
        return result

    # innermost of the middleware given so far: the check sees the call as the tool gets it
    server.middleware.append(guarded)
    setattr(server, _MARK, guard)
    if isinstance(server, MCPServer):
        _guard_in_process_calls(server, guard, denial)
    return server


def _guard_in_process_calls(server: Any, guard: Guard, denial: Callable[[str], Any]) -> None:
    """``server.call_tool`` (code calling a tool in process, past the protocol) checked too."""
    call_tool = server.call_tool

    async def guarded_call_tool(name: str, arguments: dict[str, Any], *rest: Any, **kw: Any) -> Any:
        if _CHECKED.get() != (name, arguments or {}):  # (else the middleware checked this call)
            decision = await guard.check_async(name, arguments or {})
            if not decision.allowed:
                return denial(decision.reason)
        unchecked = _CHECKED.set(None)  # a tool that calls a tool: that call is checked
        try:
            return await call_tool(name, arguments, *rest, **kw)
        finally:
            _CHECKED.reset(unchecked)

    server.call_tool = guarded_call_tool


def _protect_v1(server: Any, guard: Guard) -> Any:
    try:
        from mcp import types
        from mcp.server.fastmcp import FastMCP
        from mcp.server.lowlevel import Server
    except ImportError as exc:  # mcp is not installed
        raise ImportError(
            f"agentauth.mcp needs the mcp SDK: pip install 'agentauth[mcp]' ({exc})"
        ) from None
    if isinstance(server, FastMCP):
        lowlevel = server._mcp_server
    elif isinstance(server, Server):
        lowlevel = server
    else:
        raise TypeError(
            f"protect() takes a FastMCP or a low-level Server, not {type(server).__name__}"
        )
    handlers = lowlevel.request_handlers
    handle_call = handlers.get(types.CallToolRequest)
    if handle_call is None:
        raise TypeError(
            "this server has no tools/call handler to guard yet: register it "
            "(@server.call_tool()) before protect()"
        )

    def denial(reason: str) -> types.CallToolResult:
        text = types.TextContent(type="text", text=DENIED_PREFIX + reason)
        return types.CallToolResult(content=[text], isError=True)

    async def guarded_request(request: types.CallToolRequest) -> Any:
        params = request.params
        try:
            http = lowlevel.request_context.request
            session = transport_session(guard, getattr(http, "headers", None))
        except LookupError:  # not inside a request of the protocol
            session = None
        decision = await guard.check_async(params.name, params.arguments or {}, session_id=session)
        if not decision.allowed:
            return types.ServerResult(denial(decision.reason))
        return await handle_call(request)  # the SDK's own: validation, conversion, output

    # wrapping the registered handler keeps whatever options the SDK registered it with
    handlers[types.CallToolRequest] = guarded_request
    setattr(server, _MARK, guard)
    if isinstance(server, FastMCP):
        _guard_in_process_calls(server, guard, denial)
    return server
