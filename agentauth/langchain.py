"""LangChain tools (``BaseTool``, ``@tool``) behind the guard, in one line:
``tools = guarded(guard, [search, refund])``. LangChain agents (``create_agent``) and LangGraph
graphs take the guarded tools as they take any.

Each guarded tool is a copy of the tool it guards (same class, name, description, schemas,
``response_format`` and injected arguments), whose implementation is checked first: a call is
checked with the tool's name and the arguments the model gave (after LangChain has read them
against the schema; arguments LangChain or LangGraph inject, such as ``InjectedState``,
``InjectedToolCallId`` or ``ToolRuntime``, are not sent to the service) before the tool runs.
A single-input ``Tool`` (no schema) is checked with its input as ``tool_input``.

- Allowed: the tool runs, unchanged (its artifacts, ``Command`` results and errors as ever).
- Denied: the tool does not run; the model gets ``Authorization denied: <reason>`` as a tool
  message with ``status="error"``, LangChain's form for a failed tool. The tool's own
  ``handle_tool_error`` still applies to its own errors.
- Escalated, inside a LangGraph run (``create_agent`` is one): LangGraph's own human-in-the-loop
  mechanism. The guard calls ``interrupt()`` with the service's approval
  (``{"agentauth_approval_id", "agentauth_approval_expires_at", "agentauth_reason"}``), so the run
  pauses with that interrupt (a checkpointer is needed, as for any interrupt). A person decides
  the approval in agentauth; the application resumes the run (``Command(resume=...)``, any
  value) and the guard asks the service again: the tool runs only if that answer allows.
- Escalated outside a graph: the guard's own ``wait_for_approval``, then a denial.

Install with ``pip install 'agentauth[langchain]'``.
"""

from __future__ import annotations

import contextvars
import functools
import importlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agentauth.guard import DENIED_PREFIX

if TYPE_CHECKING:
    from agentauth.answers import Decision
    from agentauth.guard import Guard

#: the guarded tool whose call was checked on the async path and now runs its synchronous
#: implementation in a worker thread (LangChain's default ``_arun``): not checked twice
_CHECKED: contextvars.ContextVar[object | None] = contextvars.ContextVar(
    "agentauth_langchain_checked", default=None
)


def guarded(guard: Guard, tools: Sequence[Any]) -> list[Any]:
    """The tools, each behind ``guard`` (a list of ``BaseTool``, in the same order)."""
    return [guard_tool(guard, tool) for tool in tools]


def guard_tool(guard: Guard, tool: Any) -> Any:
    """One ``BaseTool`` behind ``guard``: a copy of ``tool`` whose calls are checked first."""
    try:
        # by name: the package is optional, and not installed where the main suite runs
        tools: Any = importlib.import_module("langchain_core.tools")
    except ImportError as exc:
        raise ImportError(
            f"agentauth.langchain needs langchain-core: pip install 'agentauth[langchain]' ({exc})"
        ) from None
    if not isinstance(tool, tools.BaseTool):
        raise TypeError(f"guard_tool() takes a LangChain BaseTool, not {type(tool).__name__}")

    class Denied(tools.ToolException):  # type: ignore[misc]
        """A denial: the tool's answer to the model, whatever its own error handling says."""

    copy = tool.model_copy()
    run, arun = copy._run, copy._arun
    positional = list(copy.args)  # a single-input tool's input, by its name
    schema = copy.tool_call_schema  # what the model sees: no injected arguments
    if copy.args_schema is None:  # a single-input Tool: its schema is its own input
        given = set(positional)
    elif isinstance(schema, Mapping):  # a JSON schema given as the tool's args_schema
        given = set(schema.get("properties", {}))
    else:  # a pydantic model (v2, or v1's __fields__)
        given = set(getattr(schema, "model_fields", None) or getattr(schema, "__fields__", {}))

    def parameters(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The model's arguments of one call, as the tool's implementation receives them."""
        checked = dict(zip(positional, args, strict=False))
        checked.update((k, v) for k, v in kwargs.items() if k in given)
        return checked

    def refuse(decision: Decision) -> None:
        _pause_for_approval(decision)
        raise Denied(DENIED_PREFIX + decision.reason)

    # (a resumed LangGraph run runs the tool again from the start: the question asked then is
    # the one after the approval; interrupt() returns there instead of pausing)
    @functools.wraps(run)  # the signature LangChain reads to pass run_manager and config
    def checked_run(*args: Any, **kwargs: Any) -> Any:
        if _CHECKED.get() is copy:
            _CHECKED.set(None)  # for this call only: tools it calls in turn are checked
        else:
            decision = guard.check(copy.name, parameters(args, kwargs))
            if not decision.allowed:
                refuse(decision)
        return run(*args, **kwargs)

    @functools.wraps(arun)
    async def checked_arun(*args: Any, **kwargs: Any) -> Any:
        decision = await guard.check_async(copy.name, parameters(args, kwargs))
        if not decision.allowed:
            refuse(decision)
        _CHECKED.set(copy)
        return await arun(*args, **kwargs)

    def handle(error: Any) -> Any:
        if isinstance(error, Denied):
            return error.args[0]
        return _handled(error, own)

    async def ainvoke(input: Any, config: Any = None, **kwargs: Any) -> Any:
        # LangChain's own ainvoke: a tool with no coroutine of its own would otherwise run its
        # blocking invoke in a thread, where a guard with an AsyncAuthzClient cannot ask
        return await tools.BaseTool.ainvoke(copy, input, config, **kwargs)

    own = copy.handle_tool_error
    # instance attributes, past pydantic's __setattr__ (which takes fields only)
    object.__setattr__(copy, "_run", checked_run)
    object.__setattr__(copy, "_arun", checked_arun)
    object.__setattr__(copy, "ainvoke", ainvoke)
    copy.handle_tool_error = handle
    return copy


def _handled(error: Exception, own: Any) -> Any:
    """The tool's own ``handle_tool_error`` setting applied to one of its own errors, as
    LangChain does: raised again when it says not to handle them."""
    if not own:
        raise error
    if own is True:
        return error.args[0] if error.args else "Tool execution error"
    if isinstance(own, str):
        return own
    return own(error)


def _pause_for_approval(decision: Decision) -> None:
    """For an escalation inside a LangGraph run: LangGraph's ``interrupt()`` with the service's
    approval, which raises to pause the run. Resumed, LangGraph runs the tool again from its
    start, so the decision here is already the service's answer after the person's decision:
    ``interrupt()`` then returns, and a decision still escalated is a denial (the approval is
    still pending). Nothing outside a graph run (or without langgraph)."""
    if decision.outcome != "escalated":
        return
    try:
        config: Any = importlib.import_module("langgraph.config")
        types: Any = importlib.import_module("langgraph.types")
    except ImportError:
        return
    try:
        config.get_config()  # raises outside a LangGraph run
    except RuntimeError:
        return
    types.interrupt(
        {
            "agentauth_approval_id": decision.approval_id,
            "agentauth_approval_expires_at": (
                None
                if decision.approval_expires_at is None
                else decision.approval_expires_at.isoformat()
            ),
            "agentauth_reason": decision.reason,
        }
    )
