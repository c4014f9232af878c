"""The checkout as a new contributor meets it: ``make help`` reads as text, and trying the
README's examples leaves no file that ``git status`` would offer to commit."""

from __future__ import annotations

import re
import shutil
import subprocess
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
