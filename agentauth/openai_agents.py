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
  which the model gets as the tool's output (``reject_content``), and the run goes on. With
  the SDK's ``pre_approval_tool_input_guardrails``, a denied call that would have waited for
  approval (the tool's own ``needs_approval``) is rejected before the pause, and an escalated
  one still pauses.

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

#: the decision of each call asked about by needs_approval, for its guardrail, with whether the
#: call was made to wait for approval, by everything the decision was made for: the guard, the
#: tool's name, the call's id and its arguments (a call id alone repeats across runs and
#: providers: another run's decision must never be taken); the oldest go first past
#: :data:`_KEPT` (a call the SDK rejected never reaches its guardrail)
_DECIDED: OrderedDict[tuple[int, str, str, str], tuple[Decision, bool]] = OrderedDict()
_KEPT = 10_000


def _key(guard: Guard, name: str, call_id: str, arguments: Any) -> tuple[int, str, str, str]:
    return id(guard), name, call_id, json.dumps(arguments, sort_keys=True, default=str)


def guarded(guard: Guard, tools: Sequence[Any]) -> list[Any]:
    """The function tools, each behind ``guard``, in the same order."""
    return [guard_tool(guard, tool) for tool in tools]


def approval_of(item: Any) -> dict[str, Any] | None:
    """The service's approval behind an interruption of a guarded tool (a ``ToolApprovalItem``
    of ``result.interruptions``): ``{"approval_id", "expires_at", "reason"}``, or None when the
    interruption is not the guard's."""
    raw = item.raw_item
    call_id, name = getattr(raw, "call_id", None), getattr(raw, "name", None)
    try:
        arguments = json.loads(getattr(raw, "arguments", None) or "{}")
    except ValueError:
        return None
    found = [
        decision
        for (_guard, tool, call, args), (decision, _paused) in _DECIDED.items()
        if call == call_id
        and (tool == name or tool.endswith(f".{name}"))
        and args == json.dumps(arguments, sort_keys=True, default=str)
    ]
    decision = found[-1] if found else None
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
    name = getattr(tool, "qualified_name", None) or tool.name

    async def needs_approval(ctx: Any, parameters: dict[str, Any], call_id: str) -> bool:
        decision = await guard.check_async(name, parameters)
        pause = decision.outcome == "escalated" or bool(
            await own(ctx, parameters, call_id) if callable(own) else own
        )
        _DECIDED[_key(guard, name, call_id, parameters)] = (decision, pause)
        while len(_DECIDED) > _KEPT:
            _DECIDED.popitem(last=False)
        return pause

    @agents.tool_input_guardrail  # type: ignore[untyped-decorator]
    async def authorized(data: Any) -> Any:
        context = data.context
        # the name the call was made under, namespace included (a namespaced copy of this tool
        # keeps these hooks, and must be checked as what it is)
        called = context.qualified_tool_name
        try:
            arguments = json.loads(context.tool_arguments or "{}")
        except ValueError:
            return agents.ToolGuardrailFunctionOutput.reject_content(
                DENIED_PREFIX + "the call's arguments are not JSON"
            )
        key = _key(guard, called, context.tool_call_id, arguments)
        decision, paused = _DECIDED.pop(key, (None, False))
        if paused and context.is_tool_approved(context.tool_name, context.tool_call_id) is None:
            # run before the approval pause (the SDK's pre_approval_tool_input_guardrails): a
            # denial rejects the call now; anything else waits for the person, and is asked
            # about again (an escalation) or taken (the tool's own approval) once approved
            assert decision is not None
            if decision.allowed or decision.outcome == "escalated":
                _DECIDED[key] = (decision, paused)
                return agents.ToolGuardrailFunctionOutput.allow()
        if decision is None or decision.outcome == "escalated":  # approved in the SDK: ask again
            decision = await guard.check_async(called, arguments)
        if decision.allowed:
            return agents.ToolGuardrailFunctionOutput.allow()
        return agents.ToolGuardrailFunctionOutput.reject_content(DENIED_PREFIX + decision.reason)

    return dataclasses.replace(
        tool,
        needs_approval=needs_approval,
        tool_input_guardrails=[*(tool.tool_input_guardrails or []), authorized],
    )
