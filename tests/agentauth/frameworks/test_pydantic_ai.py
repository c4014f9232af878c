"""Pydantic AI: an agent's tools guarded by one capability, in real agent runs with the
framework's own scripted models (TestModel, FunctionModel). Denials reach the model as the
tool's result; an escalation becomes Pydantic AI's own approval (``DeferredToolRequests``)
naming the service's approval, and the approved call runs once the person's decision is in the
service. Runs in the frameworks environment (``nox -s frameworks``)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults, Tool
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

from agentauth import AsyncAuthzClient, Guard
from agentauth.pydantic_ai import guarded
from tests.agentauth.cases import each_case, judge, stand_in

pytestmark = pytest.mark.anyio

KEY = "svc_" + "8" * 32


def returns(result: Any) -> list[str]:
    """What the tools returned to the model in a run, in order."""
    return [
        str(part.content)
        for message in result.all_messages()
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    ]


def scripted(tool: str, args: dict[str, Any]) -> FunctionModel:
    """A model that calls ``tool`` with ``args`` once, then answers ``done``."""

    def respond(messages: list[ModelMessage], _info: AgentInfo) -> ModelResponse:
        answered = any(isinstance(p, ToolReturnPart) for m in messages for p in m.parts)
        if answered:
            return ModelResponse(parts=[TextPart("done")])
        return ModelResponse(parts=[ToolCallPart(tool_name=tool, args=args)])

    return FunctionModel(respond)


@each_case()
async def test_every_case_of_the_shared_table(case, on_error):
    ran: list[str] = []

    def echo(text: str) -> str:
        """Echo the text."""
        ran.append(text)
        return text

    with stand_in(case) as base:
        guard = Guard(AsyncAuthzClient(base, KEY, timeout=case.timeout), "agent", on_error=on_error)
        agent = Agent(
            TestModel(),
            tools=[echo],
            capabilities=[guarded(guard)],
            output_type=[str, DeferredToolRequests],
        )
        result = await agent.run("echo something")
    if isinstance(result.output, DeferredToolRequests):  # Pydantic AI's own approval
        assert case.name == "escalated"
        assert ran == []
        [call] = result.output.approvals
        reason = result.output.metadata[call.tool_call_id]["agentauth_reason"]
        judge(case, on_error, False, "Authorization denied: " + reason, KEY)
        return
    was_run = bool(ran)
    [returned] = returns(result)
    judge(case, on_error, was_run, None if was_run else returned, KEY)


@pytest.mark.parametrize(
    ("amount", "runs"), [(25, True), (2500, False)], ids=["allowed", "denied by a limit"]
)
async def test_a_real_decision_runs_the_tool_or_answers_the_model(
    service, api_key, agent_id, amount, runs
):
    ran: list[int] = []

    def refund(amount: int, currency: str) -> str:
        """Refund an amount."""
        ran.append(amount)
        return f"refunded {amount} {currency}"

    authz = AsyncAuthzClient(service, api_key)
    arguments = {"amount": amount, "currency": "EUR"}
    bot = Agent(
        scripted("payments.refund", arguments),
        tools=[Tool(refund, name="payments.refund")],
        capabilities=[guarded(Guard(authz, agent_id))],
    )
    result = await bot.run(f"refund {amount}")
    if runs:
        assert returns(result) == [f"refunded {amount} EUR"]
        assert ran == [amount]
        return
    reason = (await authz.authorize(agent_id, "payments.refund", arguments)).reason
    assert returns(result) == [f"Authorization denied: {reason}"]
    assert ran == []


class Multiply(AbstractCapability[Any]):
    """Another capability, listed after the guard, that rewrites a refund's amount."""

    async def before_tool_execute(
        self, ctx: Any, *, call: Any, tool_def: Any, args: dict[str, Any]
    ) -> dict[str, Any]:
        return {**args, "amount": args["amount"] * 100}


async def test_the_arguments_checked_are_the_ones_the_tool_gets(
    service, api_key, agent_id, client, admin_headers
):
    """A capability listed after the guard turns a refund of 25 into 2,500: the service is
    asked about 2,500, which its limit denies, and the tool does not run."""
    ran: list[int] = []

    def refund(amount: int, currency: str) -> str:
        """Refund an amount."""
        ran.append(amount)
        return f"refunded {amount} {currency}"

    bot = Agent(
        scripted("payments.refund", {"amount": 25, "currency": "EUR"}),
        tools=[Tool(refund, name="payments.refund")],
        capabilities=[guarded(Guard(AsyncAuthzClient(service, api_key), agent_id)), Multiply()],
    )
    result = await bot.run("refund 25")
    assert ran == []
    [answer] = returns(result)
    assert answer.startswith("Authorization denied: ")
    entries = client.get(
        "/v1/audit-logs", query_string={"agent_id": agent_id}, headers=admin_headers
    ).json["data"]
    assert [e["parameters"] for e in entries] == [{"amount": 2500, "currency": "EUR"}]


async def test_an_escalation_is_pydantic_ais_approval_and_runs_once_approved(
    service, approval_agent, approve, workspace
):
    agent_id = approval_agent
    ran: list[int] = []

    async def refund(amount: int, currency: str) -> str:
        """Refund an amount."""
        ran.append(amount)
        return f"refunded {amount} {currency}"

    guard = Guard(AsyncAuthzClient(service, workspace.key("read-only")), agent_id)
    model = scripted("payments.refund", {"amount": 5000, "currency": "EUR"})
    bot = Agent(
        model,
        tools=[Tool(refund, name="payments.refund")],
        capabilities=[guarded(guard)],
        output_type=[str, DeferredToolRequests],
    )
    first = await bot.run("refund 5000")
    assert isinstance(first.output, DeferredToolRequests)
    assert ran == []
    [call] = first.output.approvals
    approval_id = first.output.metadata[call.tool_call_id]["agentauth_approval_id"]

    # resumed before a person decided: approved in Pydantic AI, still pending in the service
    early = await bot.run(
        message_history=first.all_messages(),
        deferred_tool_results=DeferredToolResults(approvals={call.tool_call_id: True}),
    )
    assert ran == []
    assert returns(early)[-1].startswith("Authorization denied: approval required")

    approve(approval_id)
    resumed = await bot.run(
        message_history=first.all_messages(),
        deferred_tool_results=DeferredToolResults(approvals={call.tool_call_id: True}),
    )
    assert ran == [5000]
    assert returns(resumed)[-1] == "refunded 5000 EUR"
