"""Running the examples of examples/ as a user would: each as its own process, against a real
``agentauth serve``, with an agent whose policy allows ``calendar.*`` and nothing else (the
``example_agent`` fixture of tests/agentauth/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
RULES = [{"type": "tool_allowlist", "tools": ["calendar.*"]}]
RUN_SECONDS = 120  # a hang guard, not a measure


def run_example(name: str, base: str, key: str, agent_id: str) -> str:
    """The example's standard output; it must exit 0."""
    environment = {**os.environ, "AGENTAUTH_URL": base, "KEY": key, "AGENT_ID": agent_id}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        env=environment,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_SECONDS,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def assert_one_allowed_one_denied(output: str) -> None:
    lines = output.strip().splitlines()
    assert lines[0] == "calendar.create: created standup", output
    assert lines[1].startswith("shell.exec: Authorization denied: "), output
