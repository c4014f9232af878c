"""LangChain: tools guarded in one line, in real agent runs (``create_agent``, a LangGraph
graph) with LangChain's own scripted chat model. Denials reach the model as a tool message with
status "error"; an escalation becomes LangGraph's own interrupt naming the service's approval,
and the resumed run calls the tool once the person's decision is in the service. Runs in the
frameworks environment (``nox -s frameworks``)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from agentauth import AsyncAuthzClient, AuthzClient, Guard
from agentauth.langchain import guarded
from tests.agentauth.cases import each_case, judge, stand_in

KEY = "svc_" + "a" * 32


class Scripted(GenericFakeChatModel):
    """LangChain's fake chat model, which agents can bind tools to (it ignores them)."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def model(tool_name: str, args: dict[str, Any]) -> Scripted:
    """Calls ``tool_name`` with ``args`` once, then answers ``done``."""
    call = {"name": tool_name, "args": args, "id": "call-1", "type": "tool_call"}
    return Scripted(messages=iter([AIMessage(content="", tool_calls=[call]), AIMessage("done")]))


def make_refund(ran: list[int]) -> Any:
    @tool("payments.refund")
    def refund(amount: int, currency: str) -> str:
        """Refund an amount."""
        ran.append(amount)
        return f"refunded {amount} {currency}"

    return refund


def tool_messages(state: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


@each_case()
def test_every_case_of_the_shared_table(case, on_error):
    ran: list[int] = []
    with stand_in(case) as base:
        guard = Guard(AuthzClient(base, KEY, timeout=case.timeout), "agent", on_error=on_error)
        agent = create_agent(
            model("payments.refund", {"amount": 5, "currency": "EUR"}),
            tools=guarded(guard, [make_refund(ran)]),
            checkpointer=InMemorySaver(),
        )
        state = agent.invoke(
            {"messages": [("user", "refund 5")]}, {"configurable": {"thread_id": case.name}}
        )
    if "__interrupt__" in state:  # LangGraph's own approval
        assert case.name == "escalated"
        assert ran == []
        [pause] = state["__interrupt__"]
        judge(
            case, on_error, False, "Authorization denied: " + pause.value["agentauth_reason"], KEY
        )
        return
    [message] = tool_messages(state)
    was_run = ran == [5]
    assert (message.status == "error") is (not was_run)
    judge(case, on_error, was_run, None if was_run else str(message.content), KEY)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["invoke", "ainvoke"])
@pytest.mark.parametrize(
    ("amount", "runs"), [(25, True), (2500, False)], ids=["allowed", "denied by a limit"]
)
def test_a_real_decision_runs_the_tool_or_answers_the_model(
    service, api_key, agent_id, amount, runs, asynchronous
):
    ran: list[int] = []
    authz = AuthzClient(service, api_key)
    arguments = {"amount": amount, "currency": "EUR"}
    guard = Guard(AsyncAuthzClient(service, api_key) if asynchronous else authz, agent_id)
    agent = create_agent(
        model("payments.refund", arguments), tools=guarded(guard, [make_refund(ran)])
    )
    request = {"messages": [("user", f"refund {amount}")]}
    state = anyio.run(agent.ainvoke, request) if asynchronous else agent.invoke(request)
    [message] = tool_messages(state)
    if runs:
        assert message.content == f"refunded {amount} EUR"
        assert ran == [amount]
        return
    reason = authz.authorize(agent_id, "payments.refund", arguments).reason
    assert message.status == "error"
    assert message.content == f"Authorization denied: {reason}"
    assert ran == []


def test_an_escalation_is_langgraphs_interrupt_and_runs_once_approved(
    service, approval_agent, approve, workspace
):
    agent_id = approval_agent
    ran: list[int] = []
    guard = Guard(AuthzClient(service, workspace.key("read-only")), agent_id)
    bot = create_agent(
        model("payments.refund", {"amount": 5000, "currency": "EUR"}),
        tools=guarded(guard, [make_refund(ran)]),
        checkpointer=InMemorySaver(),
    )
    thread = {"configurable": {"thread_id": "refund-5000"}}
    paused = bot.invoke({"messages": [("user", "refund 5000")]}, thread)
    [pause] = paused["__interrupt__"]
    approval_id = pause.value["agentauth_approval_id"]
    assert ran == []

    approve(approval_id)
    resumed = bot.invoke(Command(resume=True), thread)
    assert ran == [5000]
    assert tool_messages(resumed)[-1].content == "refunded 5000 EUR"
