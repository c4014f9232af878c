"""Authorize while a prune runs (issue #32): a log whose oldest whole day holds N entries,
``agentauth serve`` in front of it, wrk calling ``POST /v1/authorize`` first with nothing else
running (idle, IDLE_RUNS runs: one run's p99 is the tenth-worst of a thousand calls or so, and
moves by half from run to run), then again and again while ``agentauth audit prune`` archives
and removes that day, then once more idle; each run's p99 and errors beside the idle runs'
median, and the p99 of every call during the prune together beside that of the idle runs'
calls together (wrk's latencies to the microsecond, summed over the runs).

    python -m bench.prune_load --entries 1000000 [--database-url URL] [--concurrency 8]
        [--rate 100] [--seconds 10] [--keep DIR]

Without ``--rate`` wrk calls as fast as the server answers (the server saturated, the prune's
own CPU taken from it); with ``--rate R`` each of wrk's connections waits between its calls so
that all of them together make about R calls a second (the issue's day of 8.6 million entries
is 100 a second), and the p99 is what a call meets at that load. On PostgreSQL the day is one
partition (made ahead, as the service makes them), which the prune drops; on SQLite it is
deleted in paced batches of about 2.5 ms of the write lock each. Only 127.0.0.1 is used; the
server and the prune are stopped by their PIDs; the log's folder (or PostgreSQL schema) is
removed at the end, unless ``--keep DIR`` names it: then it stays, and a run given the same
folder again before that log was pruned uses it as it is (a log of 8.6 million entries takes
a quarter of an hour to write; a run stopped before its prune can start again at once).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench.audit_scale import build_log, database, serving
from bench.http_compare import (
    Point,
    _wrk_command,
    create_agent_and_policy,
    ensure_wrk,
    parse_wrk,
    run_wrk,
    stop,
    write_script,
)

#: runs with nothing else going on, before the prune (their median p99 is the reference)
IDLE_RUNS = 3
#: the longest a prune may run here before it is stopped (and the bench says so)
PRUNE_LIMIT_SECONDS = 3 * 3600
#: added to wrk's script: after its own summary, every latency it saw (microseconds) and how
#: many calls took it, so that runs add up to one distribution
HISTOGRAM_LUA = """
local summary_done = done
function done(summary, latency, requests)
  summary_done(summary, latency, requests)
  for i = 1, #latency do
    local micros, calls = latency(i)
    io.write(string.format("latency-us %d %d\\n", micros, calls))
  end
end
"""

#: one wrk run: its figures, and how many of its calls took each latency (microseconds)
Run = tuple[Point, Counter[int]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=None, help="calls a second, all together")
    parser.add_argument("--keep", type=Path, default=None, help="the log's folder, kept")
    args = parser.parse_args(argv)
    wrk = ensure_wrk()
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    day_end = today - timedelta(days=1)  # the day before yesterday, whole
    with database(args.database_url, args.keep) as (url, folder):
        built = folder / f"built-{args.entries}-{day_end:%Y%m%d}"
        if built.exists():
            print(f"the log of {folder} as it is: {built.read_text()}", flush=True)
        else:
            log = build_log(url, args.entries, folder, days=1, end=day_end)
            said = (
                f"{args.entries:,} entries on {day_end - timedelta(days=1):%Y-%m-%d}: written in "
                f"{log['write_seconds']:.0f} s, folded in {log['fold_seconds']:.0f} s"
            )
            print(said, flush=True)
            if args.keep is not None:
                built.write_text(said)
        with serving(url, folder) as (base, key, env):
            run = authorize_runs(wrk, base, key, folder, args)
            idle = idle_runs(run)
            prune_command = [sys.executable, "-m", "controller", "audit", "prune", "--db", url]
            prune_command += ["--workspace", "default", "--before", day_end.isoformat()]
            prune_command += ["--archive", str(folder / "archive")]
            built.unlink(missing_ok=True)  # the log is the prune's from here on
            began = time.perf_counter()
            prune = subprocess.Popen(prune_command, env=env, stdout=subprocess.PIPE, text=True)
            said: list[str] = []
            reader = threading.Thread(target=_read_lines, args=(prune, began, said), daemon=True)
            reader.start()
            during: list[Run] = []
            try:
                while prune.poll() is None:
                    if time.perf_counter() - began > PRUNE_LIMIT_SECONDS:
                        raise RuntimeError("the prune ran past the bench's limit")
                    during.append(run())
                    ended = time.perf_counter() - began
                    _say(f"during the prune, run {len(during)} (to {ended:.0f} s)", during[-1][0])
            finally:
                if prune.poll() is None:
                    stop(prune)  # type: ignore[arg-type]
            took = time.perf_counter() - began
            reader.join()
            after = run()
            _say("idle again, after the prune", after[0])
    _report(args, idle, during, after, took, prune.returncode, "\n".join(said))
    return 0


def authorize_runs(
    wrk: str, base: str, key: str, folder: Path, args: argparse.Namespace
) -> Callable[[], Run]:
    """wrk calling ``POST /v1/authorize`` for an agent and policy of its own, warmed up: a
    run each call, of ``args.seconds`` at ``args.concurrency`` (and ``args.rate``, if given)."""
    # a name of its own: a kept log may hold the agent of an earlier run
    body = create_agent_and_policy(base, key, f"bench-agent-{time.time_ns()}")
    script = write_script(folder / "authorize.lua", body, key, '"allowed"')
    if args.rate:
        _pace(script, args.concurrency, args.rate)
    with script.open("a") as lua:
        lua.write(HISTOGRAM_LUA)
    target = base + "/v1/authorize"
    run_wrk(wrk, target, script, args.concurrency, 2)  # warm up
    command = _wrk_command(wrk, target, script, args.concurrency, args.seconds)

    def run() -> Run:
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.seconds + 60)
        if done.returncode != 0:
            raise RuntimeError(f"wrk failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        latencies: Counter[int] = Counter()
        for micros, calls in re.findall(r"^latency-us (\d+) (\d+)$", done.stdout, re.MULTILINE):
            latencies[int(micros)] += int(calls)
        return parse_wrk(done.stdout, args.concurrency), latencies

    return run


def idle_runs(run: Callable[[], Run]) -> list[Run]:
    """:data:`IDLE_RUNS` runs with nothing else going on, each said as it ends."""
    idle: list[Run] = []
    for n in range(IDLE_RUNS):
        idle.append(run())
        _say(f"idle, run {n + 1}", idle[-1][0])
    return idle


def percentile_ms(runs: list[Run], percent: float) -> float:
    """The latency (ms) that ``percent`` % of the calls of ``runs``, all together, took at most."""
    together: Counter[int] = Counter()
    for _, latencies in runs:
        together.update(latencies)
    wanted = percent / 100 * sum(together.values())
    seen = 0
    for micros in sorted(together):
        seen += together[micros]
        if seen >= wanted:
            return micros / 1000
    return 0.0


def _pace(script: Path, concurrency: int, rate: float) -> None:
    """wrk's ``script`` made to wait between a connection's calls, so that ``concurrency``
    connections make about ``rate`` calls a second together (while the server keeps up)."""
    pause_ms = max(1, round(1000 * concurrency / rate))
    with script.open("a") as lua:
        lua.write(f"function delay() return {pause_ms} end\n")


def _read_lines(prune: subprocess.Popen[str], began: float, said: list[str]) -> None:
    """The prune's lines as it says them, each with the time since it started (which of the
    runs were during its archive, which during its removal)."""
    assert prune.stdout is not None
    for line in prune.stdout:
        said.append(f"{time.perf_counter() - began:.0f} s: {line.rstrip()}")
        print(f"prune, {said[-1]}", flush=True)


def _say(name: str, point: Point) -> None:
    """One run's figures as it ends (a prune of millions runs for many of them)."""
    errors = point.unexpected + point.socket_errors
    print(f"{name}: {point.rps:,.0f} req/s, p99 {point.p99_ms:.2f} ms, {errors} errors", flush=True)


def _report(
    args: argparse.Namespace,
    before: list[Run],
    pruning: list[Run],
    after_run: Run,
    took: float,
    code: int,
    said: str,
) -> None:
    idle = [point for point, _ in before]
    during = [point for point, _ in pruning]
    after = after_run[0]
    store = "PostgreSQL" if args.database_url else "SQLite"
    print(f"\nprune on {store}: exit {code} in {took:.1f} s; it said: {said.strip()}\n")
    load = f", about {args.rate:,.0f} calls/s" if args.rate else ", as fast as answered"
    print(f"| authorize, c={args.concurrency}{load} | req/s | p50 ms | p99 ms | errors |")
    print("|---|--:|--:|--:|--:|")
    rows = [(f"idle, run {n + 1}", p) for n, p in enumerate(idle)]
    rows += [(f"during the prune, run {n + 1}", p) for n, p in enumerate(during)]
    rows.append(("idle again, after the prune", after))
    for name, point in rows:
        errors = point.unexpected + point.socket_errors
        print(f"| {name} | {point.rps:,.0f} | {point.p50_ms:.2f} | {point.p99_ms:.2f} | {errors} |")
    if during:
        worst = max(p.p99_ms for p in during)
        reference = statistics.median(p.p99_ms for p in idle)
        within = sum(p.p99_ms <= 2 * reference for p in during)
        print(
            f"\nidle p99, median of {len(idle)}: {reference:.2f} ms; during the prune: worst "
            f"{worst:.2f} ms = {worst / reference:.2f} x idle, median "
            f"{statistics.median(p.p99_ms for p in during):.2f} ms; {within} of {len(during)} "
            "runs within 2 x idle"
        )
        idle_p99 = percentile_ms(before, 99)
        during_p99 = percentile_ms(pruning, 99)
        print(
            f"every call together: idle p99 {idle_p99:.2f} ms ({sum(p.requests for p in idle):,} "
            f"calls), during the prune p99 {during_p99:.2f} ms ({sum(p.requests for p in during):,}"
            f" calls) = {during_p99 / idle_p99:.2f} x idle; slowest call during the prune "
            f"{max(p.max_ms for p in during):.2f} ms"
        )


if __name__ == "__main__":
    sys.exit(main())
