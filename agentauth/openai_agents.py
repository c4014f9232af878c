"""OpenAI Agents SDK function tools behind the guard, in one line:
``Agent(..., tools=guarded(guard, [refund, search]))``.

Each tool gets two hooks of the SDK's own, and keeps everything else:

- ``needs_approval``: asks the service, once per call. An ``escalated`` decision makes the call
  need approval: the run stops with the SDK's own interruption (``result.interruptions``), and
  :func:`approval_of` gives the service's approval for it (id, expiry, reason). A person decides
  that approval in agentauth; the application approves the interruption
  (``state.approve(item)``) and runs on: the guard asks the service again, and the tool runs
  only if that answer allows. Rejected in the SDK, the tool does not run.
- a tool input guardrail: a denial rejects the call with ``Authorization denied: <reason>``,
  which the model gets as the tool's output (``reject_content``), and the run goes on.

A tool's own ``needs_approval`` still applies (either one asks for approval). Install with
``pip install 'agentauth[openai-agents]'``.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agentauth.guard import DENIED_PREFIX

if TYPE_CHECKING:
    from agentauth.answers import Decision
    from agentauth.guard import Guard

#: the decision of each call asked about by needs_approval, for its guardrail (by call id); the
#: oldest go first past :data:`_KEPT` (a call the SDK rejected never reaches its guardrail)
_DECIDED: OrderedDict[str, Decision] = OrderedDict()
_KEPT = 10_000


def guarded(guard: Guard, tools: Sequence[Any]) -> list[Any]:
    """The function tools, each behind ``guard``, in the same order."""
    return [guard_tool(guard, tool) for tool in tools]


def approval_of(item: Any) -> dict[str, Any] | None:
    """The service's approval behind an interruption of a guarded tool (a ``ToolApprovalItem``
    of ``result.interruptions``): ``{"approval_id", "expires_at", "reason"}``, or None when the
    interruption is not the guard's."""
    call_id = getattr(item.raw_item, "call_id", None)
    decision = _DECIDED.get(call_id) if isinstance(call_id, str) else None
    if decision is None or decision.outcome != "escalated":
        return None
    expires = decision.approval_expires_at
    return {
        "approval_id": decision.approval_id,
        "expires_at": None if expires is None else expires.isoformat(),
        "reason": decision.reason,
    }


def guard_tool(guard: Guard, tool: Any) -> Any:
    """One ``FunctionTool`` behind ``guard`` (a copy; the tool given is unchanged)."""
    try:
        # by name: the package is optional, and not installed where the main suite runs
        agents: Any = importlib.import_module("agents")
    except ImportError as exc:
        raise ImportError(
            "agentauth.openai_agents needs the OpenAI Agents SDK: "
            f"pip install 'agentauth[openai-agents]' ({exc})"
        ) from None
    if not isinstance(tool, agents.FunctionTool):
        raise TypeError(f"guard_tool() takes a FunctionTool, not {type(tool).__name__}")
    own = tool.needs_approval

    async def needs_approval(ctx: Any, parameters: dict[str, Any], call_id: str) -> bool:
        decision = await guard.check_async(tool.name, parameters)
        _DECIDED[call_id] = decision
        while len(_DECIDED) > _KEPT:
            _DECIDED.popitem(last=False)
        if decision.outcome == "escalated":
            return True
        return bool(await own(ctx, parameters, call_id) if callable(own) else own)

    @agents.tool_input_guardrail  # type: ignore[untyped-decorator]
    async def authorized(data: Any) -> Any:
        context = data.context
        decision = _DECIDED.pop(context.tool_call_id, None)
        if decision is None or decision.outcome == "escalated":  # approved in the SDK: ask again
            arguments = json.loads(context.tool_arguments or "{}")
            decision = await guard.check_async(tool.name, arguments)
        if decision.allowed:
            return agents.ToolGuardrailFunctionOutput.allow()
        return agents.ToolGuardrailFunctionOutput.reject_content(DENIED_PREFIX + decision.reason)

    return dataclasses.replace(
        tool,
        needs_approval=needs_approval,
        tool_input_guardrails=[*(tool.tool_input_guardrails or []), authorized],
    )
