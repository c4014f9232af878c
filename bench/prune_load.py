"""Authorize while a prune runs (issue #32): a log whose oldest whole day holds N entries,
``agentauth serve`` in front of it, wrk calling ``POST /v1/authorize`` first with nothing else
running (idle), then again and again while ``agentauth audit prune`` archives and removes that
day; each run's p99 and errors beside the idle one's.

    python -m bench.prune_load --entries 1000000 [--database-url URL] [--concurrency 8]

On PostgreSQL the day is one partition (made ahead, as the service makes them), which the
prune drops; on SQLite it is deleted 2,000 entries a transaction. Only 127.0.0.1 is used; the
server and the prune are stopped by their PIDs; the log's folder (or PostgreSQL schema) is
removed at the end.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta

from bench.audit_scale import build_log, database, serving
from bench.http_compare import (
    Point,
    create_agent_and_policy,
    ensure_wrk,
    run_wrk,
    stop,
    write_script,
)

#: the longest a prune may run here before it is stopped (and the bench says so)
PRUNE_LIMIT_SECONDS = 3 * 3600


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args(argv)
    wrk = ensure_wrk()
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    day_end = today - timedelta(days=1)  # the day before yesterday, whole
    with database(args.database_url) as (url, folder):
        log = build_log(url, args.entries, folder, days=1, end=day_end)
        print(
            f"{args.entries:,} entries on {day_end - timedelta(days=1):%Y-%m-%d}: written in "
            f"{log['write_seconds']:.0f} s, folded in {log['fold_seconds']:.0f} s",
            flush=True,
        )
        with serving(url, folder) as (base, key, env):
            body = create_agent_and_policy(base, key)
            script = write_script(folder / "authorize.lua", body, key, '"allowed"')
            target = base + "/v1/authorize"
            run_wrk(wrk, target, script, args.concurrency, 2)  # warm up
            idle = run_wrk(wrk, target, script, args.concurrency, args.seconds)
            _say("idle", idle)
            prune_command = [sys.executable, "-m", "controller", "audit", "prune", "--db", url]
            prune_command += ["--workspace", "default", "--before", day_end.isoformat()]
            prune_command += ["--archive", str(folder / "archive")]
            began = time.perf_counter()
            prune = subprocess.Popen(prune_command, env=env, stdout=subprocess.PIPE, text=True)
            said: list[str] = []
            reader = threading.Thread(target=_read_lines, args=(prune, began, said), daemon=True)
            reader.start()
            during: list[Point] = []
            try:
                while prune.poll() is None:
                    if time.perf_counter() - began > PRUNE_LIMIT_SECONDS:
                        raise RuntimeError("the prune ran past the bench's limit")
                    during.append(run_wrk(wrk, target, script, args.concurrency, args.seconds))
                    ended = time.perf_counter() - began
                    _say(f"during the prune, run {len(during)} (to {ended:.0f} s)", during[-1])
            finally:
                if prune.poll() is None:
                    stop(prune)  # type: ignore[arg-type]
            took = time.perf_counter() - began
            reader.join()
    _report(args, idle, during, took, prune.returncode, "\n".join(said))
    return 0


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
    args: argparse.Namespace, idle: Point, during: list[Point], took: float, code: int, said: str
) -> None:
    store = "PostgreSQL" if args.database_url else "SQLite"
    print(f"\nprune on {store}: exit {code} in {took:.1f} s; it said: {said.strip()}\n")
    print(f"| authorize, c={args.concurrency} | req/s | p50 ms | p99 ms | errors |")
    print("|---|--:|--:|--:|--:|")
    rows = [("idle", idle)] + [(f"during the prune, run {n + 1}", p) for n, p in enumerate(during)]
    for name, point in rows:
        errors = point.unexpected + point.socket_errors
        print(f"| {name} | {point.rps:,.0f} | {point.p50_ms:.2f} | {point.p99_ms:.2f} | {errors} |")
    if during:
        worst = max(p.p99_ms for p in during)
        print(f"\nworst p99 during the prune: {worst:.2f} ms = {worst / idle.p99_ms:.2f} x idle")


if __name__ == "__main__":
    sys.exit(main())
