"""The checkout as a new contributor meets it: ``make help`` reads as text, and trying the
README's examples leaves no file that ``git status`` would offer to commit."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_help_shows_values_not_variable_names():
    result = subprocess.run(
        ["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert "test-pg" in result.stdout
    assert "$(" not in result.stdout, result.stdout
    assert "postgresql://postgres@127.0.0.1:5432/test" in result.stdout


def _files_the_readme_writes() -> set[str]:
    readme = (ROOT / "README.md").read_text()
    written = set(re.findall(r"sqlite:///([\w.-]+\.db)\b", readme))
    written |= {name + "-wal" for name in written} | {name + "-shm" for name in written}
    return written


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="not a git checkout")
def test_files_the_readme_examples_write_are_ignored_by_git():
    written = _files_the_readme_writes()
    assert {"agentauth.db", "demo.db"} <= written
    result = subprocess.run(
        ["git", "check-ignore", "--no-index", *sorted(written)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    ignored = set(result.stdout.split())
    assert ignored == written, f"not in .gitignore: {sorted(written - ignored)}"


def _demo_commands() -> list[list[str]]:
    """The README's policy-repository demo, one command a line, as written."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("Try it (it needs no server):", 1)[1].split("```sh\n", 1)[1]
    return [line.split() for line in block.split("```", 1)[0].splitlines() if line.strip()]


def test_the_readme_policy_repository_demo_runs_as_written(tmp_path):
    """Each command of the demo exits 0, in order, on a fresh database (demo.db in a folder of
    its own, the example repository copied beside it)."""
    shutil.copytree(ROOT / "policies_repo_example", tmp_path / "policies_repo_example")
    commands = _demo_commands()
    assert [c[:2] for c in commands] == [
        [".venv/bin/agentauth", "validate"],
        [".venv/bin/agentauth", "test"],
        [".venv/bin/agentauth", "db"],
        [".venv/bin/agentauth", "plan"],
        [".venv/bin/agentauth", "apply"],
    ]
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "AGENTAUTH_CACHE_DIR": ""}
    for command in commands:
        run = [sys.executable, "-m", "controller", *command[1:]]
        result = subprocess.run(
            run, cwd=tmp_path, capture_output=True, text=True, check=False, env=environment
        )
        assert result.returncode == 0, f"{' '.join(command)}:\n{result.stdout}{result.stderr}"
    assert (tmp_path / "demo.db").exists()
