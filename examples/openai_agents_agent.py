"""An OpenAI Agents SDK agent whose function tools are behind agentauth, in one line.

    KEY=svc_... AGENT_ID=... python examples/openai_agents_agent.py

The model here is the SDK's own ``ScriptedModel``, so the example runs without an API key: it
calls ``calendar.create`` (allowed by a policy that allows ``calendar.*``), then ``shell.exec``
(denied: the model gets the denial as the tool's output). Put your model in its place
(``Agent(name=..., model="gpt-5", ...)``); the guard line stays."""

from __future__ import annotations

import os

from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

from agentauth import AsyncAuthzClient, Guard
from agentauth.openai_agents import guarded

set_tracing_disabled(True)


@function_tool(name_override="calendar.create")
def create(title: str) -> str:
    """Create a calendar event."""
    return f"created {title}"


@function_tool(name_override="shell.exec")
def shell(cmd: str) -> str:
    """Run a shell command."""
    return f"ran {cmd}"


model = ScriptedModel(
    [
        ModelStep(output=[function_call("calendar.create", {"title": "standup"}, call_id="1")]),
        ModelStep(output=[function_call("shell.exec", {"cmd": "id"}, call_id="2")]),
        ModelStep(output=[assistant_message("done")]),
    ]
)
service = os.environ.get("AGENTAUTH_URL", "http://127.0.0.1:8080")
guard = Guard(AsyncAuthzClient(service, os.environ["KEY"]), os.environ["AGENT_ID"])
agent = Agent(name="planner", model=model, tools=guarded(guard, [create, shell]))  # the one line

if __name__ == "__main__":
    result = Runner.run_sync(agent, "plan my day")
    called = {
        i.raw_item.call_id: i.raw_item.name for i in result.new_items if i.type == "tool_call_item"
    }
    for item in result.new_items:
        if item.type == "tool_call_output_item":
            print(f"{called[item.raw_item['call_id']]}: {item.output}")
