"""Benchmark 4: validate and plan a large generated policy repository.

1,000 agents and 10,000 policies (10 per agent, 5 rules each: globs, an anchored regex, an
enum, min/max, a time window), one file per object: 11,000 files. Timed as a user runs them,
each a fresh ``agentauth`` process against a fresh SQLite database:

1. ``agentauth validate DIR`` with an empty document cache;
2. ``agentauth plan DIR`` with an empty document cache (everything to create);
3. ``agentauth plan DIR`` again after one policy file changed: the cache holds every other
   file, so only that one is parsed and validated again.

Called by ``python -m bench``; ``python -m bench.controller_plan`` runs it alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

AGENTS = 1_000
POLICIES_PER_AGENT = 10
TARGET_SECONDS = 10.0

AGENT = """# yaml-language-server: $schema=../schemas/document.json
apiVersion: agentauth/v1
kind: Agent
metadata:
  name: agent-{a:04d}
spec:
  description: generated agent {a}
"""
POLICY = """apiVersion: agentauth/v1
kind: Policy
metadata:
  name: agent-{a:04d}-policy-{p:02d}
spec:
  agent: agent-{a:04d}
  priority: {priority}
  rules:
    - type: tool_allowlist
      tools: ["tool{p}.*", "shared.read_*"]
    - type: parameter_constraint
      tools: ["tool{p}.write"]
      parameters:
        path: {{regex: "^/srv/agent-{a:04d}/[a-z0-9_/]+$"}}
        mode: {{enum: [append, replace]}}
        size: {{min: 0, max: {max_size}}}
    - type: time_based
      tools: ["tool{p}.write"]
      timeWindow:
        timezone: Europe/Berlin
        allowedHours: [8, 9, 10, 11, 12, 13, 14, 15, 16, 17]
        allowedDays: [1, 2, 3, 4, 5]
    - type: rate_limit
      tools: ["tool{p}.*"]
      rateLimit: {{maxCalls: 100, windowSeconds: 60}}
    - type: tool_denylist
      tools: ["tool{p}.delete_*"]
"""


@dataclass(frozen=True)
class PlanTimes:
    files: int
    validate_cold: float
    plan_cold: float
    plan_one_changed: float
    plan_one_changed_output: str


def generate(root: Path) -> Path:
    """Write the repository under ``root``; returns the file the second plan changes."""
    for a in range(AGENTS):
        (root / "agents").mkdir(parents=True, exist_ok=True)
        (root / "agents" / f"agent-{a:04d}.yaml").write_text(AGENT.format(a=a))
        folder = root / "policies" / f"agent-{a:04d}"
        folder.mkdir(parents=True, exist_ok=True)
        for p in range(POLICIES_PER_AGENT):
            text = POLICY.format(a=a, p=p, priority=100 - p, max_size=1000 * (p + 1))
            (folder / f"policy-{p:02d}.yaml").write_text(text)
    return root / "policies" / "agent-0500" / "policy-03.yaml"


def _run(args: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    command = [sys.executable, "-m", "controller", *args]
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    return time.perf_counter() - start, done


def _check(done: subprocess.CompletedProcess[str], codes: tuple[int, ...], what: str) -> None:
    if done.returncode not in codes:
        raise RuntimeError(f"{what} exited {done.returncode}:\n{done.stdout[-2000:]}{done.stderr}")


def bench_plan() -> PlanTimes:
    work = Path(tempfile.mkdtemp(prefix="agentauth-plan-bench-"))
    try:
        repo = work / "repo"
        changed = generate(repo)
        url = f"sqlite:///{work / 'plan.db'}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTAUTH_")}
        _check(_run(["db", "upgrade", "--db", url], env)[1], (0,), "db upgrade")
        env["AGENTAUTH_CACHE_DIR"] = str(work / "cache-validate")
        validate, done = _run(["validate", str(repo)], env)
        _check(done, (0,), "validate")
        env["AGENTAUTH_CACHE_DIR"] = str(work / "cache-plan")
        plan_args = ["plan", str(repo), "--db", url, "--format", "json", "--detailed-exitcode"]
        cold, done = _run(plan_args, env)
        _check(done, (2,), "plan")
        changed.write_text(changed.read_text().replace("max: 4000", "max: 4500"))
        warm, done = _run(plan_args, env)
        _check(done, (2,), "plan after one change")
        files = sum(1 for _ in repo.rglob("*.yaml"))
        return PlanTimes(files, validate, cold, warm, done.stdout)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    times = bench_plan()
    print(times.files, times.validate_cold, times.plan_cold, times.plan_one_changed)


if __name__ == "__main__":
    main()
