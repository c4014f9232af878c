"""Hostile policy files: alias bombs and deep nesting are refused by ``validate`` with a clear
message, inside hard memory and CPU limits set on the process by the kernel; and the loader
never raises on any input at all (hypothesis), it reports a located problem instead."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.load import SourceFile, parse_file

#: what ``validate`` may use on a hostile file, enforced by setrlimit (it needs about 60 to
#: 140 MB and half a second of CPU on these; see docs/reliability.md)
MEMORY_LIMIT = 768 * 1024 * 1024
CPU_SECONDS = 60

_HEAD = "apiVersion: agentauth/v1\nkind: Agent\nmetadata: {name: d}\nspec:\n  description: "


def _laughs() -> str:
    lines = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, 10)]
    return "\n".join(lines) + "\n"  # 10^9 strings once expanded


HOSTILE = {
    "billion-laughs": (_laughs(), "agents/a.yaml:1:40: $: aliases expand to more than 1000 nodes"),
    "quadratic-aliases": (
        "a: &a [" + ",".join(["x"] * 50_000) + "]\nb: [" + ",".join(["*a"] * 50_000) + "]\n",
        "agents/a.yaml:1:4: $: aliases expand to more than 1000 nodes",
    ),
    "recursive-alias": ("a: &a [*a]\n", "agents/a.yaml:1:4: $: a recursive alias is not allowed"),
    "200k-nested-lists": (
        _HEAD + "[" * 200_000 + "]" * 200_000 + "\n",
        "agents/a.yaml:5:79: $: nests more than 64 levels deep",
    ),
    "100k-nested-maps": (
        _HEAD + "{a: " * 100_000 + "1" + "}" * 100_000 + "\n",
        "agents/a.yaml:5:265: $: nests more than 64 levels deep",
    ),
    "5000-block-levels": (
        "".join("  " * i + "a:\n" for i in range(5000)) + "  " * 5000 + "b\n",
        "agents/a.yaml:65:129: $: nests more than 64 levels deep",
    ),
}


#: ``python -c`` this, then the limits, the module and its arguments: it sets both limits on
#: itself and then runs the module as ``python -m`` would. (No preexec_fn: running Python code
#: between fork and exec is unsafe in a process with threads, as pytest's may have.)
_LIMITED = """
import resource, runpy, sys
memory, cpu, module = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
sys.argv = [module, *sys.argv[4:]]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def _limited(module: str, *args: str) -> list[str]:
    """The command running ``python -m module args`` under both limits."""
    limits = [str(MEMORY_LIMIT), str(CPU_SECONDS)]
    return [sys.executable, "-c", _LIMITED, *limits, module, *args]


def test_the_child_runs_under_both_limits_with_the_arguments_given(tmp_path: Path):
    (tmp_path / "show_limits.py").write_text(
        "import resource, sys\n"
        "print(resource.getrlimit(resource.RLIMIT_AS), resource.getrlimit(resource.RLIMIT_CPU))\n"
        "print(__name__, sys.argv[1:])\n"
    )
    result = subprocess.run(
        _limited("show_limits", "validate", "x y"),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=CPU_SECONDS * 2,
        check=True,
    )
    assert result.stdout.splitlines() == [
        f"{(MEMORY_LIMIT, MEMORY_LIMIT)} {(CPU_SECONDS, CPU_SECONDS)}",
        "__main__ ['validate', 'x y']",
    ]


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_file_is_refused_within_memory_and_cpu_limits(tmp_path: Path, name: str):
    text, message = HOSTILE[name]
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "a.yaml").write_text(text)
    result = subprocess.run(
        _limited("controller", "validate", str(tmp_path)),  # killed past either limit
        capture_output=True,
        text=True,
        timeout=CPU_SECONDS * 2,  # a hang guard: the CPU limit does not count time asleep
        check=False,
        # the YAML reader's own bounds are under test, not the file size limit that comes
        # first (5000 block levels take 25 MB)
        env={**os.environ, "AGENTAUTH_MAX_POLICY_FILE_BYTES": str(64 << 20)},
    )
    assert result.returncode == 1, (result.returncode, result.stderr[-2000:])
    assert result.stdout.splitlines() == [message]
    assert "Traceback" not in result.stderr
    assert result.stderr.strip() == "1 file(s): 1 error(s), 0 warning(s)"


# ------------------------------------------------------------------------- any input at all

_TOKENS = st.sampled_from(
    [
        "apiVersion: agentauth/v1\n", "kind: Policy\n", "kind: Agent\n", "metadata:\n",
        "  name: x\n", "spec:\n", "  agent: x\n", "  rules:\n", "    - type: rate_limit\n",
        "      rateLimit: {maxCalls: 1, windowSeconds: 60}\n", "- ", "? ", ": ", "[", "]", "{",
        "}", ",", "&a ", "*a", "&b ", "*b", "<<: *a\n", "!!python/object:os.system ", "!x ",
        "---\n", "...\n", "%YAML 1.1\n", "'", '"', "\\", "#", "|\n", ">-\n", "\t", "  ", "\n",
        "~", "null", "true", "on", "1e400", "0x1F", ".nan", "2026-11-21", "é", "\x00", "\ufeff",
        "\x85", "\u2028", "x", "1", "!!int ", "!!bool ", "!!float ", "0x_",
    ]
)  # fmt: skip


def _check(content: bytes) -> None:
    loaded = parse_file(SourceFile("p/f.yaml", content))
    for problem in loaded.problems:
        assert problem.file == "p/f.yaml"
        assert problem.line >= 1
        assert problem.message


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_TOKENS, max_size=60).map("".join))
def test_the_loader_never_raises_on_yaml_like_text(text: str):
    _check(text.encode("utf-8"))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_the_loader_never_raises_on_arbitrary_bytes(content: bytes):
    _check(content)
