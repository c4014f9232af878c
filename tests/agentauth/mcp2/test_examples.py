"""examples/mcp_server.py and examples/fastmcp_server.py, run as a user would, on the mcp 2
line (nox -s mcp2)."""

from __future__ import annotations

import pytest

from tests.agentauth.examples import assert_one_allowed_one_denied, run_example


@pytest.mark.parametrize("name", ["mcp_server.py", "fastmcp_server.py"])
def test_the_example_runs(service, api_key, example_agent, name):
    assert_one_allowed_one_denied(run_example(name, service, api_key, example_agent))
