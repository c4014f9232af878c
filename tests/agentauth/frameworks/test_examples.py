"""The agent frameworks' examples (examples/*_agent.py), run as a user would
(nox -s frameworks)."""

from __future__ import annotations

import pytest

from tests.agentauth.examples import assert_one_allowed_one_denied, run_example


@pytest.mark.parametrize(
    "name", ["pydantic_ai_agent.py", "langchain_agent.py", "openai_agents_agent.py"]
)
def test_the_example_runs(service, api_key, example_agent, name):
    assert_one_allowed_one_denied(run_example(name, service, api_key, example_agent))
