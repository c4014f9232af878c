"""LangChain: tools guarded in one line, in real agent runs (``create_agent``, a LangGraph
graph) with LangChain's own scripted chat model. Denials reach the model as a tool message with
status "error"; an escalation becomes LangGraph's own interrupt naming the service's approval,
and the resumed run calls the tool once the person's decision is in the service. Runs in the
frameworks environment (``nox -s frameworks``)."""

from __future__ import annotations

from typing import Annotated, Any

import anyio
import pytest
from langchain.agents import create_agent
from langchain.tools import ToolRuntime
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import InjectedToolCallId, Tool, ToolException, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.prebuilt import InjectedState
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


def audited_parameters(client: Any, admin_headers: dict[str, str], agent_id: str) -> list[Any]:
    entries = client.get(
        "/v1/audit-logs", query_string={"agent_id": agent_id}, headers=admin_headers
    ).json["data"]
    return [entry["parameters"] for entry in entries]


@pytest.mark.parametrize(
    ("amount", "runs"), [(25, True), (2500, False)], ids=["allowed", "denied by a limit"]
)
def test_injected_arguments_reach_the_tool_and_never_the_service(
    service, api_key, agent_id, client, admin_headers, amount, runs
):
    """A LangGraph tool with the state, the call's id and the runtime injected, answering with
    a ``Command``: the service is asked about the model's arguments only, and the tool gets its
    injected ones and updates the graph as ever."""
    seen: list[Any] = []

    @tool("payments.refund")
    def refund(
        amount: int,
        currency: str,
        state: Annotated[dict, InjectedState],
        call_id: Annotated[str, InjectedToolCallId],
        runtime: ToolRuntime,
    ) -> Command:
        """Refund an amount."""
        seen.append((amount, len(state["messages"]), call_id, runtime.tool_call_id))
        message = ToolMessage(f"refunded {amount} {currency}", tool_call_id=call_id)
        return Command(update={"messages": [message]})

    guard = Guard(AuthzClient(service, api_key), agent_id)
    agent = create_agent(
        model("payments.refund", {"amount": amount, "currency": "EUR"}),
        tools=guarded(guard, [refund]),
    )
    state = agent.invoke({"messages": [("user", f"refund {amount}")]})
    [message] = tool_messages(state)
    assert audited_parameters(client, admin_headers, agent_id) == [
        {"amount": amount, "currency": "EUR"}
    ]
    if runs:
        assert seen == [(25, 2, "call-1", "call-1")]
        assert message.content == "refunded 25 EUR"
        return
    assert seen == []
    assert message.status == "error"
    assert str(message.content).startswith("Authorization denied: ")


def test_a_tools_artifact_reaches_the_graph(service, api_key, agent_id):
    @tool("calendar.search", response_format="content_and_artifact")
    def search(day: str) -> tuple[str, list[str]]:
        """Find meetings."""
        return f"2 meetings on {day}", ["standup", "review"]

    guard = Guard(AuthzClient(service, api_key), agent_id)
    agent = create_agent(
        model("calendar.search", {"day": "monday"}), tools=guarded(guard, [search])
    )
    [message] = tool_messages(agent.invoke({"messages": [("user", "meetings?")]}))
    assert message.content == "2 meetings on monday"
    assert message.artifact == ["standup", "review"]


@pytest.mark.parametrize(("text", "runs"), [("hello", True), ("rm -rf /", False)])
def test_a_single_input_tool_is_checked_with_its_input(
    service, api_key, client, admin_headers, text, runs
):
    """A ``Tool`` with no schema takes one string; the service sees it as ``tool_input``."""
    agent_id = client.post("/v1/agents", json={"name": "echo-bot"}, headers=admin_headers).json[
        "id"
    ]
    policy = {
        "agent_id": agent_id,
        "name": "echo-safe-text",
        "rules": [
            {
                "type": "parameter_constraint",
                "tools": ["echo"],
                "parameters": {"tool_input": {"regex": "^[a-z ]*$"}},
            },
            {"type": "tool_allowlist", "tools": ["echo"]},
        ],
    }
    assert client.post("/v1/policies", json=policy, headers=admin_headers).status_code == 201
    ran: list[str] = []

    def echo(text: str) -> str:
        ran.append(text)
        return text

    guard = Guard(AuthzClient(service, api_key), agent_id)
    agent = create_agent(
        model("echo", {"__arg1": text}),
        tools=guarded(guard, [Tool(name="echo", func=echo, description="Echo.")]),
    )
    [message] = tool_messages(agent.invoke({"messages": [("user", "say it")]}))
    assert audited_parameters(client, admin_headers, agent_id)[0] == {"tool_input": text}
    assert ran == ([text] if runs else [])
    assert (message.status == "error") is (not runs)


def test_the_tools_own_errors_are_handled_as_it_says(service, api_key, agent_id):
    """A denial always reaches the model; the tool's own ToolException still follows its own
    ``handle_tool_error`` (here none: it is raised, as without the guard)."""

    @tool("calendar.search")
    def search(day: str) -> str:
        """Find meetings."""
        raise ToolException(f"no calendar for {day}")

    [checked] = guarded(Guard(AuthzClient(service, api_key), agent_id), [search])
    with pytest.raises(ToolException, match="no calendar for monday"):
        checked.invoke({"day": "monday"})
    search.handle_tool_error = True
    [checked] = guarded(Guard(AuthzClient(service, api_key), agent_id), [search])
    assert checked.invoke({"day": "monday"}) == "no calendar for monday"
    [denied] = guarded(Guard(AuthzClient(service, api_key), agent_id), [make_refund([])])
    assert denied.invoke({"amount": 5000, "currency": "EUR"}).startswith("Authorization denied: ")


def test_a_guarded_tool_calling_another_is_checked_for_both(
    service, api_key, agent_id, client, admin_headers
):
    """On the async path the tool's blocking body runs in a thread without a second check of
    its own call; a guarded tool it calls from there is still checked."""
    guard = Guard(AsyncAuthzClient(service, api_key), agent_id)
    sync_guard = Guard(AuthzClient(service, api_key), agent_id)
    ran: list[int] = []
    [inner] = guarded(sync_guard, [make_refund(ran)])

    @tool("calendar.search")
    def search(day: str) -> str:
        """Find meetings, and refund something."""
        return inner.invoke({"amount": 5000, "currency": "EUR"})

    [outer] = guarded(guard, [search])
    answer = anyio.run(outer.ainvoke, {"day": "monday"})
    assert answer.startswith("Authorization denied: ")
    assert ran == []
    assert sorted(map(str, audited_parameters(client, admin_headers, agent_id))) == sorted(
        map(str, [{"day": "monday"}, {"amount": 5000, "currency": "EUR"}])
    )
