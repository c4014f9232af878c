"""LangChain tools (``BaseTool``, ``@tool``) behind the guard, in one line:
``tools = guarded(guard, [search, refund])``. LangChain agents (``create_agent``) and LangGraph
graphs take the guarded tools as they take any.

Each guarded tool has the name, description and argument schema of the tool it guards; a call
is checked with the tool's name and its arguments (after LangChain has read them against the
schema) before the tool runs.

- Allowed: the tool runs, unchanged.
- Denied: the tool does not run; the model gets ``Authorization denied: <reason>`` as a tool
  message with ``status="error"``, LangChain's form for a failed tool.
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

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agentauth.guard import DENIED_PREFIX

if TYPE_CHECKING:
    from agentauth.answers import Decision
    from agentauth.guard import Guard


def guarded(guard: Guard, tools: Sequence[Any]) -> list[Any]:
    """The tools, each behind ``guard`` (a list of ``BaseTool``, in the same order)."""
    return [guard_tool(guard, tool) for tool in tools]


def guard_tool(guard: Guard, tool: Any) -> Any:
    """One ``BaseTool`` behind ``guard``: a ``StructuredTool`` of the same name and schema."""
    try:
        # by name: the package is optional, and not installed where the main suite runs
        tools: Any = importlib.import_module("langchain_core.tools")
    except ImportError as exc:
        raise ImportError(
            f"agentauth.langchain needs langchain-core: pip install 'agentauth[langchain]' ({exc})"
        ) from None
    if not isinstance(tool, tools.BaseTool):
        raise TypeError(f"guard_tool() takes a LangChain BaseTool, not {type(tool).__name__}")

    def refuse(decision: Decision) -> None:
        raise tools.ToolException(DENIED_PREFIX + decision.reason)

    # (a resumed LangGraph run runs the tool again from the start: the question asked then is
    # the one after the approval; interrupt() returns there instead of pausing)
    async def arun(**arguments: Any) -> Any:
        decision = await guard.check_async(tool.name, arguments)
        if not decision.allowed:
            _pause_for_approval(decision)
            refuse(decision)
        return await tool.ainvoke(arguments)

    def run(**arguments: Any) -> Any:
        decision = guard.check(tool.name, arguments)
        if not decision.allowed:
            _pause_for_approval(decision)
            refuse(decision)
        return tool.invoke(arguments)

    return tools.StructuredTool.from_function(
        func=run,
        coroutine=arun,
        name=tool.name,
        description=tool.description,
        args_schema=tool.args_schema,
        return_direct=tool.return_direct,
        handle_tool_error=True,  # the denial text, as a tool message with status "error"
    )


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
