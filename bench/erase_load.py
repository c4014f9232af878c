"""Authorize while an agent is deleted (issue #32): a log of N entries over 30 days (50 agents,
so each holds about N/50), ``agentauth serve`` in front of it, wrk calling ``POST
/v1/authorize`` for another agent, first with nothing else running (idle), then while ``DELETE
/v1/agents/{id}`` erases one agent's entries a batch a transaction, then idle again. Each run's
p99, its slowest call and its errors; the target is that no call waits behind the erasure for
more than 100 ms.

    python -m bench.erase_load --entries 1000000 [--database-url URL] [--concurrency 8]
        [--rate 100] [--seconds 10]

``--rate`` as in :mod:`bench.prune_load`. Only 127.0.0.1 is used; the server is stopped by its
PID; the log's folder (or PostgreSQL schema) is removed at the end.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

from bench.audit_scale import build_log, database, serving
from bench.http_compare import Point, ensure_wrk, http
from bench.prune_load import authorize_runs, idle_runs

#: the longest the deletion may take here (a request of the bench's own)
DELETE_LIMIT_SECONDS = 3600.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=None, help="calls a second, all together")
    args = parser.parse_args(argv)
    wrk = ensure_wrk()
    with database(args.database_url) as (url, folder):
        log = build_log(url, args.entries, folder)
        print(
            f"{args.entries:,} entries: written in {log['write_seconds']:.0f} s, "
            f"folded in {log['fold_seconds']:.0f} s",
            flush=True,
        )
        with serving(url, folder) as (base, key, _env):
            run = authorize_runs(wrk, base, key, folder, args)
            idle = idle_runs(run)
            victim = log["agents"][0]
            answer: list[tuple[int, float]] = []

            def delete() -> None:
                began = time.perf_counter()
                status, _ = http(
                    "DELETE", f"{base}/v1/agents/{victim}", key=key, timeout=DELETE_LIMIT_SECONDS
                )
                answer.append((status, time.perf_counter() - began))

            deleting = threading.Thread(target=delete, daemon=True)
            deleting.start()
            during: list[Point] = []
            while deleting.is_alive():
                during.append(run())
            deleting.join()
            after = run()
    status, took = answer[0] if answer else (0, 0.0)
    _report(args, idle, during, after, status, took)
    return 0 if status == 204 else 1


def _report(
    args: argparse.Namespace,
    idle: list[Point],
    during: list[Point],
    after: Point,
    status: int,
    took: float,
) -> None:
    store = "PostgreSQL" if args.database_url else "SQLite"
    held = f"about {args.entries // 50:,} entries"
    print(f"\nDELETE of an agent with {held} on {store}: {status} in {took:.1f} s")
    load = f", about {args.rate:,.0f} calls/s" if args.rate else ", as fast as answered"
    print(f"| authorize, c={args.concurrency}{load} | req/s | p50 ms | p99 ms | max ms | errors |")
    print("|---|--:|--:|--:|--:|--:|")
    rows = [(f"idle, run {n + 1}", p) for n, p in enumerate(idle)]
    rows += [(f"during the deletion, run {n + 1}", p) for n, p in enumerate(during)]
    rows.append(("idle again, after it", after))
    for name, point in rows:
        errors = point.unexpected + point.socket_errors
        print(
            f"| {name} | {point.rps:,.0f} | {point.p50_ms:.2f} | {point.p99_ms:.2f} "
            f"| {point.max_ms:.2f} | {errors} |"
        )
    if during:
        print(
            f"\nidle: p99 median {statistics.median(p.p99_ms for p in idle):.2f} ms, slowest "
            f"{max(p.max_ms for p in idle):.2f} ms; during the deletion: p99 worst "
            f"{max(p.p99_ms for p in during):.2f} ms, "
            f"slowest {max(p.max_ms for p in during):.2f} ms"
        )


if __name__ == "__main__":
    sys.exit(main())
