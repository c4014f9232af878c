"""What a policy on trial costs a decision (issue #33, decisions §10): one ``agentauth serve``
on a fresh SQLite database, three agents with the bench's policy, and wrk calling
``POST /v1/authorize`` for each in turn, interleaved round by round (the order reversed every
other round, so that a drift of the machine hits all alike):

- ``none``: the policy alone (no would-be decision: the agents most calls come from);
- ``shadow``: the same and a shadow policy that decides the call first (a deny of another tool
  and a grant: its would-be decision is made off the write lock);
- ``shadow + limit``: a shadow policy with a rate limit too, so that each would-be grant takes
  its own counter in the batch (a savepoint, a counter upsert).

For each, the medians over the rounds of throughput and of the server's CPU time per answered
call (from /proc: its processes, all their threads), and the ratio of each to ``none``.

    python -m bench.shadow_cost [--concurrency 8] [--seconds 6] [--rounds 4]

Only 127.0.0.1 is used; the server is stopped by its PID; the database lives in a temporary
folder removed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.http_compare import (
    BENCH_POLICY_RULES,
    PARAMETERS,
    TOOL,
    Point,
    create_admin_key,
    ensure_wrk,
    free_port,
    http,
    run_spread,
    run_wrk,
    running,
    server_env,
    write_script,
)

#: a policy on trial above the bench's policy: it decides the bench's call (a grant), so that
#: the would-be decision is a whole evaluation of its own
SHADOW_RULES: list[dict[str, Any]] = [
    {"type": "tool_denylist", "tools": ["search.delete", "shell.*"]},
    {"type": "tool_allowlist", "tools": ["search.*"]},
]
SHADOW_LIMIT_RULES: list[dict[str, Any]] = [
    *SHADOW_RULES,
    {"type": "rate_limit", "tools": ["search.*"], "rateLimit": {"maxCalls": 1_000_000,
                                                               "windowSeconds": 86400}},
]  # fmt: skip
VARIANTS = (("none", None), ("shadow", SHADOW_RULES), ("shadow + limit", SHADOW_LIMIT_RULES))


@dataclass(frozen=True)
class Variant:
    name: str
    points: tuple[Point, ...]

    @property
    def rps(self) -> float:
        return statistics.median(p.rps for p in self.points)

    @property
    def cpu_micros(self) -> float:
        return statistics.median(p.cpu_micros for p in self.points)


def _agent(base: str, key: str, name: str, shadow: list[dict[str, Any]] | None) -> dict[str, Any]:
    """An agent with the bench's policy (and ``shadow``, on trial above it); the authorize body."""
    status, agent = http("POST", base + "/v1/agents", {"name": name}, key)
    assert status == 201, agent
    policies = [{"name": "bench", "rules": BENCH_POLICY_RULES, "priority": 0}]
    if shadow is not None:
        policies.append({"name": "trial", "rules": shadow, "priority": 10, "mode": "shadow"})
    for policy in policies:
        status, created = http("POST", base + "/v1/policies", {"agent_id": agent["id"], **policy},
                               key)  # fmt: skip
        assert status == 201, created
    return {"agent_id": agent["id"], "tool_name": TOOL, "parameters": PARAMETERS}


def measure(concurrency: int, seconds: float, rounds: int, warmup: float = 1.0) -> list[Variant]:
    wrk = ensure_wrk()
    with tempfile.TemporaryDirectory(prefix="agentauth-shadow-") as folder:
        workdir = Path(folder)
        env = server_env()
        url = f"sqlite:///{workdir / 'bench.db'}"
        key = create_admin_key(url, env)
        base = f"http://127.0.0.1:{free_port()}"
        command = [sys.executable, "-m", "controller", "serve", "--host", "127.0.0.1"]
        command += ["--port", base.rsplit(":", 1)[1], "--db", url]
        healthy = lambda: http("GET", base + "/healthz")[0] == 200  # noqa: E731
        with contextlib.ExitStack() as stack:
            master = stack.enter_context(running(command, env, workdir / "serve.log", healthy))
            scripts = []
            for n, (name, rules) in enumerate(VARIANTS):
                body = _agent(base, key, f"agent-{n}", rules)
                status, answer = http("POST", base + "/v1/authorize", body, key)
                assert status == 200, answer
                assert (answer["allowed"], answer["warnings"]) == (True, []), (name, answer)
                scripts.append(write_script(workdir / f"{n}.lua", body, key, '"allowed":true'))
            target = base + "/v1/authorize"
            points: list[list[Point]] = [[] for _ in VARIANTS]
            for round_ in range(rounds):
                order = list(range(len(VARIANTS)))
                for i in order if round_ % 2 == 0 else order[::-1]:
                    run_wrk(wrk, target, scripts[i], concurrency, warmup)
                    point = run_spread(wrk, target, scripts[i], concurrency, seconds, master)
                    points[i].append(point)
                    print(
                        f"  round {round_ + 1} {VARIANTS[i][0]:15} {point.rps:8,.0f} req/s  "
                        f"server CPU {point.cpu_micros:6,.0f} µs/req  p99 {point.p99_ms:6.2f} ms"
                        + (f"  UNEXPECTED {point.unexpected}" if point.unexpected else ""),
                        flush=True,
                    )
    return [Variant(name, tuple(found)) for (name, _), found in zip(VARIANTS, points, strict=True)]


def report(found: list[Variant], concurrency: int) -> str:
    none = found[0]
    lines = [
        f"| authorize, c={concurrency} | req/s (median) | server CPU µs/call (median) "
        "| CPU / none | req/s / none |",
        "|---|--:|--:|--:|--:|",
    ]
    for variant in found:
        lines.append(
            f"| {variant.name} | {variant.rps:,.0f} | {variant.cpu_micros:,.0f} "
            f"| {variant.cpu_micros / none.cpu_micros:.3f} | {variant.rps / none.rps:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)
    found = measure(args.concurrency, args.seconds, args.rounds)
    print()
    print(report(found, args.concurrency))
    return 0


if __name__ == "__main__":
    sys.exit(main())
