"""A LangChain agent (``create_agent``, on LangGraph) whose tools are behind agentauth, in one
line.

    KEY=svc_... AGENT_ID=... python examples/langchain_agent.py

The model here is LangChain's own scripted fake chat model, so the example runs without a model
provider: it calls ``calendar.create`` (allowed by a policy that allows ``calendar.*``), then
``shell.exec`` (denied: the model gets a tool message with status "error" and the denial). Put
your model in its place (``create_agent("openai:gpt-5", ...)``); the guard line stays."""

from __future__ import annotations

import os
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool

from agentauth import AuthzClient, Guard
from agentauth.langchain import guarded


class Scripted(GenericFakeChatModel):
    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def step(name: str, args: dict[str, Any]) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": name}])


model = Scripted(
    messages=iter(
        [
            step("calendar.create", {"title": "standup"}),
            step("shell.exec", {"cmd": "id"}),
            AIMessage("done"),
        ]
    )
)


@tool("calendar.create")
def create(title: str) -> str:
    """Create a calendar event."""
    return f"created {title}"


@tool("shell.exec")
def shell(cmd: str) -> str:
    """Run a shell command."""
    return f"ran {cmd}"


service = os.environ.get("AGENTAUTH_URL", "http://127.0.0.1:8080")
guard = Guard(AuthzClient(service, os.environ["KEY"]), os.environ["AGENT_ID"])
agent = create_agent(model, tools=guarded(guard, [create, shell]))  # the one line: guarded(...)

if __name__ == "__main__":
    state = agent.invoke({"messages": [("user", "plan my day")]})
    for message in state["messages"]:
        if isinstance(message, ToolMessage):
            print(f"{message.name}: {message.content}")
