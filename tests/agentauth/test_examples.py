"""examples/mcp_server.py, run as a user would, on the mcp 1.x line the main suite installs."""

from __future__ import annotations

import pytest

from tests.agentauth.examples import assert_one_allowed_one_denied, run_example


@pytest.mark.slow
def test_the_mcp_server_example_runs(service, api_key, example_agent):
    assert_one_allowed_one_denied(run_example("mcp_server.py", service, api_key, example_agent))
