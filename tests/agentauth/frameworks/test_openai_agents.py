"""The OpenAI Agents SDK: function tools guarded in one line, in real agent runs with the SDK's
own scripted model (``agents.testing.ScriptedModel``). A denial reaches the model as the tool's
output (a tool input guardrail's ``reject_content``); an escalation is the SDK's own approval
interruption, naming the service's approval, and the tool runs once a person approved it in the
service. Runs in the frameworks environment (``nox -s frameworks``)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest
from agents import Agent, RunConfig, Runner, function_tool, set_tracing_disabled
from agents.run_config import ToolExecutionConfig
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

from agentauth import AsyncAuthzClient, Guard
from agentauth.openai_agents import approval_of, guarded
from tests.agentauth.cases import each_case, judge, stand_in
from tests.agentauth.faults import faulty_service

pytestmark = pytest.mark.anyio
set_tracing_disabled(True)  # nothing leaves the machine

KEY = "svc_" + "b" * 32


def model(amount: int) -> ScriptedModel:
    """Calls payments.refund once, then answers done."""
    arguments = {"amount": amount, "currency": "EUR"}
    return ScriptedModel(
        [
            ModelStep(output=[function_call("payments.refund", arguments, call_id=f"c-{amount}")]),
            ModelStep(output=[assistant_message("done")]),
        ]
    )


def make_refund(ran: list[int]) -> Any:
    @function_tool(name_override="payments.refund")
    def refund(amount: int, currency: str) -> str:
        """Refund an amount."""
        ran.append(amount)
        return f"refunded {amount} {currency}"

    return refund


def outputs(result: Any) -> list[str]:
    return [str(i.output) for i in result.new_items if i.type == "tool_call_output_item"]


@each_case()
async def test_every_case_of_the_shared_table(case, on_error):
    ran: list[int] = []
    with stand_in(case) as base:
        guard = Guard(AsyncAuthzClient(base, KEY, timeout=case.timeout), "agent", on_error=on_error)
        agent = Agent(name="bot", model=model(5), tools=guarded(guard, [make_refund(ran)]))
        result = await Runner.run(agent, "refund 5")
    if result.interruptions:  # the SDK's own approval
        assert case.name == "escalated"
        assert ran == []
        [item] = result.interruptions
        approval = approval_of(item)
        assert approval is not None
        judge(case, on_error, False, "Authorization denied: " + approval["reason"], KEY)
        return
    was_run = ran == [5]
    [output] = outputs(result)
    judge(case, on_error, was_run, None if was_run else output, KEY)


@pytest.mark.parametrize(
    ("amount", "runs"), [(25, True), (2500, False)], ids=["allowed", "denied by a limit"]
)
async def test_a_real_decision_runs_the_tool_or_answers_the_model(
    service, api_key, agent_id, client, admin_headers, amount, runs
):
    ran: list[int] = []
    authz = AsyncAuthzClient(service, api_key)
    agent = Agent(
        name="bot", model=model(amount), tools=guarded(Guard(authz, agent_id), [make_refund(ran)])
    )
    result = await Runner.run(agent, f"refund {amount}")
    [output] = outputs(result)
    entries = client.get(
        "/v1/audit-logs", query_string={"agent_id": agent_id}, headers=admin_headers
    ).json["data"]
    assert len(entries) == 1  # one decision for the call: needs_approval's, reused
    if runs:
        assert output == f"refunded {amount} EUR"
        assert ran == [amount]
        return
    reason = (
        await authz.authorize(agent_id, "payments.refund", {"amount": amount, "currency": "EUR"})
    ).reason
    assert output == f"Authorization denied: {reason}"
    assert ran == []


def run_config(pre_approval: bool) -> RunConfig:
    """The SDK's settings: its input guardrails before the approval pause too, or not."""
    return RunConfig(
        tool_execution=ToolExecutionConfig(pre_approval_tool_input_guardrails=pre_approval)
    )


@pytest.mark.parametrize(
    "pre_approval", [False, True], ids=["guardrails", "pre-approval guardrails"]
)
async def test_an_escalation_is_the_sdks_interruption_and_runs_once_approved(
    service, approval_agent, approve, workspace, pre_approval
):
    agent_id = approval_agent
    ran: list[int] = []
    guard = Guard(AsyncAuthzClient(service, workspace.key("read-only")), agent_id)
    bot = Agent(name="bot", model=model(5000), tools=guarded(guard, [make_refund(ran)]))

    first = await Runner.run(bot, "refund 5000", run_config=run_config(pre_approval))
    [item] = first.interruptions
    approval = approval_of(item)
    assert approval is not None
    assert ran == []

    approve(approval["approval_id"])
    state = first.to_state()
    state.approve(item)
    resumed = await Runner.run(bot, state, run_config=run_config(pre_approval))
    assert ran == [5000]
    assert outputs(resumed)[-1] == "refunded 5000 EUR"


@pytest.mark.parametrize(
    "pre_approval", [False, True], ids=["guardrails", "pre-approval guardrails"]
)
@pytest.mark.parametrize(
    ("amount", "runs"), [(25, True), (2500, False)], ids=["allowed", "denied by a limit"]
)
async def test_a_tool_with_its_own_approval_keeps_it(
    service, api_key, agent_id, client, admin_headers, amount, runs, pre_approval
):
    """A tool that always asks a person first: allowed by the service, it waits for the
    person and then runs on the one decision; denied, the person is asked first (the SDK's
    plain guardrails, which run at execution) or not at all (pre-approval guardrails)."""
    ran: list[int] = []
    own = dataclasses.replace(make_refund(ran), needs_approval=True)
    bot = Agent(
        name="bot",
        model=model(amount),
        tools=guarded(Guard(AsyncAuthzClient(service, api_key), agent_id), [own]),
    )
    first = await Runner.run(bot, f"refund {amount}", run_config=run_config(pre_approval))
    if not runs and pre_approval:
        assert first.interruptions == []
        assert outputs(first)[-1].startswith("Authorization denied: ")
    else:
        [item] = first.interruptions
        assert approval_of(item) is None  # the tool's own approval, not the service's
        state = first.to_state()
        state.approve(item)
        first = await Runner.run(bot, state, run_config=run_config(pre_approval))
    assert ran == ([amount] if runs else [])
    if runs:
        assert outputs(first)[-1] == f"refunded {amount} EUR"
    else:
        assert outputs(first)[-1].startswith("Authorization denied: ")
    entries = client.get(
        "/v1/audit-logs", query_string={"agent_id": agent_id}, headers=admin_headers
    ).json["data"]
    assert len(entries) == 1  # one decision, whenever the guardrail ran


async def test_approved_in_the_sdk_alone_the_tool_does_not_run(service, approval_agent, workspace):
    """The SDK's approval is not the service's: until a person approves in agentauth, the
    guard's second question is answered 'approval required' and the tool does not run."""
    agent_id = approval_agent
    ran: list[int] = []
    guard = Guard(AsyncAuthzClient(service, workspace.key("read-only")), agent_id)
    bot = Agent(name="bot", model=model(5000), tools=guarded(guard, [make_refund(ran)]))
    first = await Runner.run(bot, "refund 5000")
    state = first.to_state()
    state.approve(first.interruptions[0])
    resumed = await Runner.run(bot, state)
    assert ran == []
    assert outputs(resumed)[-1].startswith("Authorization denied: approval required")


async def test_a_decision_is_never_taken_for_another_guards_call_of_the_same_id():
    """Call ids repeat across runs and providers: one agent's allowed decision for call "c-1"
    must not let another agent's call "c-1" (denied by the service) run."""
    allow = b'{"allowed": true, "outcome": "allowed", "reason": "fine"}'
    deny = b'{"allowed": false, "outcome": "denied", "reason": "not for you"}'
    arguments = {"amount": 5, "currency": "EUR"}
    with stand_in_body(allow) as alice_base, stand_in_body(deny) as mallory_base:
        alice = guarded(Guard(AsyncAuthzClient(alice_base, KEY), "alice"), [make_refund([])])[0]
        mallory = guarded(Guard(AsyncAuthzClient(mallory_base, KEY), "mallory"), [make_refund([])])[
            0
        ]
        assert await mallory.needs_approval(None, arguments, "c-1") is False  # denied, kept
        assert await alice.needs_approval(None, arguments, "c-1") is False  # allowed, kept
        context = SimpleNamespace(
            tool_call_id="c-1",
            tool_arguments=json.dumps(arguments),
            qualified_tool_name="payments.refund",
        )
        guardrail = mallory.tool_input_guardrails[-1]
        verdict = await guardrail.guardrail_function(SimpleNamespace(context=context, agent=None))
    assert verdict.behavior["type"] == "reject_content"
    assert verdict.behavior["message"] == "Authorization denied: not for you"


@contextmanager
def stand_in_body(body: bytes) -> Iterator[str]:
    with faulty_service(200, body) as (base, _received):
        yield base
