"""Every tool of a Pydantic AI agent behind the guard, in one line:
``Agent(model, tools=[...], capabilities=[guarded(guard)])``.

The guard is a Pydantic AI capability (``before_tool_execute``): each tool call the agent makes,
whatever toolset it comes from, is checked with the tool's name and its arguments as the tool
will get them: validated by Pydantic AI and after any other capability's rewrite (the guard
places itself in the innermost tier of the capabilities, so it sees them last). Output
functions are not tool calls: Pydantic AI runs them without tool hooks, and the guard does not
see them.

- Allowed: the tool runs, unchanged.
- Denied: the tool does not run; the model gets ``Authorization denied: <reason>`` as the
  tool's result, and the run goes on (the model may try something else).
- Escalated: Pydantic AI's own human-in-the-loop mechanism. The call is deferred with
  ``ApprovalRequired``: the run ends with ``DeferredToolRequests`` whose metadata for that call
  names the service's approval (``agentauth_approval_id``, ``agentauth_approval_expires_at``,
  ``agentauth_reason``). A person decides the approval in agentauth (API, dashboard, webhook);
  the application then resumes the run with ``DeferredToolResults(approvals={call_id: True})``
  and the guard asks the service again: the tool runs only if that answer allows (the approval
  was approved, and it is used up by this call); else the model gets the denial.

Install with ``pip install 'agentauth[pydantic-ai]'``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from agentauth.guard import DENIED_PREFIX

if TYPE_CHECKING:
    from agentauth.guard import Guard


def guarded(guard: Guard) -> Any:
    """A capability to give an ``Agent`` (``capabilities=[guarded(guard)]``)."""
    try:
        # by name: the package is optional, and not installed where the main suite runs
        capabilities: Any = importlib.import_module("pydantic_ai.capabilities")
        exceptions: Any = importlib.import_module("pydantic_ai.exceptions")
    except ImportError as exc:
        raise ImportError(
            "agentauth.pydantic_ai needs pydantic-ai 2.x: "
            f"pip install 'agentauth[pydantic-ai]' ({exc})"
        ) from None

    class AgentAuth(capabilities.AbstractCapability):  # type: ignore[misc]
        """Checks each tool call with the authorization service before the tool runs."""

        def get_ordering(self) -> Any:
            # after every other capability's before_tool_execute: the arguments checked are the
            # ones the tool runs with
            return capabilities.CapabilityOrdering(position="innermost")

        async def before_tool_execute(
            self, ctx: Any, *, call: Any, tool_def: Any, args: dict[str, Any]
        ) -> dict[str, Any]:
            decision = await guard.check_async(tool_def.name, args)
            if decision.allowed:
                return args
            if decision.outcome == "escalated" and not ctx.tool_call_approved:
                raise exceptions.ApprovalRequired(
                    metadata={
                        "agentauth_approval_id": decision.approval_id,
                        "agentauth_approval_expires_at": (
                            None
                            if decision.approval_expires_at is None
                            else decision.approval_expires_at.isoformat()
                        ),
                        "agentauth_reason": decision.reason,
                    }
                )
            raise exceptions.SkipToolExecution(DENIED_PREFIX + decision.reason)

    return AgentAuth()
