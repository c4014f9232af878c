"""Fixtures for the controller: policy repositories written to tmp_path, and the CLI run the
way a user runs it (click's runner, the real database of this test run)."""

from __future__ import annotations

import secrets
import textwrap
from pathlib import Path

import pytest


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


def write_files(root: Path, files: dict[str, str | None]) -> None:
    """Write (dedented) files under root; None deletes a file."""
    for name, content in files.items():
        path = root / name
        if content is None:
            path.unlink(missing_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(content).lstrip("\n"), encoding="utf-8")


def agent_doc(name: str, extra: str = "") -> str:
    return f"""
    apiVersion: agentauth/v1
    kind: Agent
    metadata:
      name: {name}
    spec: {{{extra}}}
    """


@pytest.fixture
def repo_dir(tmp_path: Path) -> Path:
    path = tmp_path / "policies"
    path.mkdir()
    return path


@pytest.fixture
def ws_name() -> str:
    return f"gitops-{secrets.token_hex(5)}"
