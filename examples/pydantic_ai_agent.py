"""A Pydantic AI agent whose tools are behind agentauth, in one line (a capability).

    KEY=svc_... AGENT_ID=... python examples/pydantic_ai_agent.py

The model here is Pydantic AI's own scripted ``FunctionModel``, so the example runs without a
model provider: it calls ``calendar.create`` (allowed by a policy that allows ``calendar.*``), then
``shell.exec`` (denied: the model gets the denial as the tool's result). Put your model in its
place (``Agent("openai:gpt-5", ...)``); the guard line stays."""

from __future__ import annotations

import os

from pydantic_ai import Agent, Tool
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agentauth import AsyncAuthzClient, Guard
from agentauth.pydantic_ai import guarded

PLAN = [("calendar.create", {"title": "standup"}), ("shell.exec", {"cmd": "id"})]


def scripted(messages: list[ModelMessage], _info: AgentInfo) -> ModelResponse:
    """Calls the tools of PLAN one after the other, then says what each returned."""
    returned = [p for m in messages for p in m.parts if p.part_kind == "tool-return"]
    if len(returned) < len(PLAN):
        tool, arguments = PLAN[len(returned)]
        return ModelResponse(parts=[ToolCallPart(tool_name=tool, args=arguments)])
    return ModelResponse(
        parts=[TextPart("\n".join(f"{p.tool_name}: {p.content}" for p in returned))]
    )


def create(title: str) -> str:
    """Create a calendar event."""
    return f"created {title}"


def shell(cmd: str) -> str:
    """Run a shell command."""
    return f"ran {cmd}"


service = os.environ.get("AGENTAUTH_URL", "http://127.0.0.1:8080")
guard = Guard(AsyncAuthzClient(service, os.environ["KEY"]), os.environ["AGENT_ID"])
agent = Agent(
    FunctionModel(scripted),
    tools=[Tool(create, name="calendar.create"), Tool(shell, name="shell.exec")],
    capabilities=[guarded(guard)],  # the one line
)

if __name__ == "__main__":
    print(agent.run_sync("plan my day").output)
