"""``python -m bench`` (``make bench``): the benchmarks, printed as Markdown tables.

1. In-process decisions per second: our engine, cedarpy and pycasbin on the same policy
   (:mod:`bench.engine_compare`), after checking that all three agree on every request.
2. POST /v1/authorize over HTTP against the real Cerbos server (:mod:`bench.peer_compare`,
   :mod:`bench.cerbos`): the same policy and request mix, points interleaved; with
   ``--with-bare``, also against a bare Flask endpoint on our own server setup
   (:mod:`bench.http_compare`); then a per-phase profile of one authorize request.
3. Validate and plan of a generated repository of 1,000 agents and 10,000 policies, cold and
   after one file changed (:mod:`bench.controller_plan`).

Installs ``bench/requirements.txt`` into the running interpreter when a package is missing,
Cerbos into the bench's own cache with npm, and ``wrk`` with apt-get when missing and running
as root. Exits 1 when the engines or the servers disagree, or a server answers anything
unexpected; missing a performance target is reported, not an error.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bench.http_compare import HttpConfig
    from bench.peer_compare import PeerConfig

REQUIREMENTS = Path(__file__).with_name("requirements.txt")
ENGINE_TARGET = 10.0  # ours / the faster of cedarpy and pycasbin
HTTP_TARGET = 0.60  # authorize / bare endpoint throughput at concurrency 8
CHAIN_TARGET = 0.90  # authorize with the audit chain / without it, at every concurrency
PEER_TARGET = 1.0  # ours / Cerbos throughput at concurrency 8 and 32; p99 at 8 at most Cerbos's
SPREAD_MARGIN = 1.10  # ours' max/min over the c=32 runs at most 10% above Cerbos's in them


def _too_old(package: str, minimum: str) -> bool:
    def numbers(version: str) -> tuple[int, ...]:
        return tuple(int(part) for part in re.findall(r"\d+", version)[:3])

    try:
        return numbers(importlib.metadata.version(package)) < numbers(minimum)
    except importlib.metadata.PackageNotFoundError:
        return True


def ensure_requirements() -> None:
    """``pip install -r bench/requirements.txt`` when a package there is missing or older than
    its ``>=`` bound."""
    wanted = re.findall(r"^([A-Za-z0-9_.-]+)>=([\d.]+)", REQUIREMENTS.read_text(), re.MULTILINE)
    missing = [name for name, minimum in wanted if _too_old(name, minimum)]
    if missing:
        print(f"installing {', '.join(missing)} from {REQUIREMENTS} into {sys.prefix}", flush=True)
        command = [sys.executable, "-m", "pip", "install", "-q", "-r", str(REQUIREMENTS)]
        subprocess.run(command, check=True)
        importlib.invalidate_caches()


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def machine() -> list[tuple[str, str]]:
    model = "unknown"
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    wrk = shutil.which("wrk")
    wrk_version = "-"
    if wrk:
        shown = subprocess.run([wrk, "-v"], capture_output=True, text=True).stdout.split()
        wrk_version = shown[1] if len(shown) > 1 else "?"
    usable = len(os.sched_getaffinity(0))
    return [
        ("date", datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")),
        ("CPU", model),
        ("cores", f"{os.cpu_count()} logical, {usable} usable by this process"),
        ("OS", f"{platform.system()} {platform.release()}"),
        ("Python", platform.python_version()),
        ("SQLite", sqlite3.sqlite_version),
        (
            "packages",
            ", ".join(
                f"{p} {_version(p)}"
                for p in (
                    "flask",
                    "granian",
                    "sqlalchemy",
                    "psycopg",
                    "google-re2",
                    "cedarpy",
                    "casbin",
                )
            ),
        ),
        ("wrk", wrk_version),
        ("Cerbos", _cerbos_version()),
    ]


def _cerbos_version() -> str:
    from bench import cerbos

    found = cerbos.installed_version(cerbos.binary_path())
    return f"{found} ({cerbos.PACKAGE})" if found else "-"


def print_table(header: list[str], rows: list[list[str]], text: tuple[int, ...] = (0,)) -> None:
    """A Markdown table; columns other than ``text`` hold numbers and align right."""
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" if i in text else "--:" for i in range(len(header))) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(flush=True)


def run_engines(seconds: float) -> bool:
    from bench import engine_compare as ec

    print("## 1. In-process decisions per second (10 policies x 5 rules, one agent)\n")
    mix = ", ".join(f"{n} {kind}" for kind, n in sorted(ec.rule_mix(ec.POLICIES).items()))
    allowed = sum(r.expect.startswith("allow") for r in ec.REQUESTS)
    print(
        f"Rules: {mix}. Request mix: {len(ec.REQUESTS)} calls, {allowed} allowed (by 9 "
        f"different policies), {len(ec.REQUESTS) - allowed} denied.\n"
    )
    engines = ec.build_engines(ec.POLICIES, ec.REQUESTS)
    problems = ec.check_agreement(engines, ec.POLICIES, ec.REQUESTS)
    if problems:
        print("ENGINES DISAGREE:")
        for problem in problems:
            print("  " + problem)
        return False
    print(
        f"All three engines agree on all {len(ec.REQUESTS)} requests (outcome and deciding "
        "policy where reported).\n"
    )
    rates = ec.time_engines(engines, ec.REQUESTS, seconds)
    ours = rates[0].decisions_per_second
    print_table(
        ["engine", "decisions/s", "µs/decision", "ours is", "how"],
        [
            [
                r.engine,
                f"{r.decisions_per_second:,.0f}",
                f"{r.microseconds:.2f}",
                "1.0x" if r is rates[0] else f"{ours / r.decisions_per_second:.1f}x",
                r.note,
            ]
            for r in rates
        ],
        text=(0, 4),
    )
    floor = ec.cedar_floor(engines, seconds)
    print(
        f"cedarpy binding floor (same requests, one `permit(principal, action, resource);`): "
        f"{floor:,.0f} decisions/s; ours is {ours / floor:.1f}x that.\n"
    )
    fastest = max(rates[1:], key=lambda r: r.decisions_per_second)
    ratio = ours / fastest.decisions_per_second
    verdict = "meets" if ratio >= ENGINE_TARGET else "BELOW"
    print(
        f"**Ratio vs the faster competitor ({fastest.engine}): {ratio:.1f}x** "
        f"(target >= {ENGINE_TARGET:.0f}x: {verdict} target)\n",
        flush=True,
    )
    return True


def run_peer(config: PeerConfig) -> bool:
    from bench import engine_compare as ec
    from bench import http_compare as hc
    from bench import peer_compare as pc

    print("## 2. POST /v1/authorize against the real Cerbos server\n")
    ours_processes = config.servers * config.workers
    kept_at_32 = pc.SPREAD_CONCURRENCY in config.concurrencies and config.c32_runs > 0
    print(
        f"Ours: {pc.ours_setup(config)}; {pc.database_kind(config)}; every decision's audit "
        f"entry committed before the answer. The peer: {pc.peer_setup()}. Both on 127.0.0.1, "
        f"up at once. wrk, 1 thread per process ({config.servers} process"
        f"{'es, the connections split between them' if config.servers > 1 else ''} per point), "
        f"{config.warmup:g} s warm-up + {config.seconds:g} s per point, a Lua script cycling "
        f"through the {len(ec.REQUESTS)} calls of the mix in the same order for both; "
        f"interleaved rounds per concurrency (ours, Cerbos, then the other way round): "
        f"{config.rounds}"
        + (f", and {config.c32_runs} at concurrency {pc.SPREAD_CONCURRENCY}" if kept_at_32 else "")
        + "; medians reported.\n"
    )
    print(
        "The same policy in both: the 10 policies x 5 rules of part 1, through our API for "
        "ours and translated by `bench.cerbos.to_cerbos` for Cerbos. Ours also holds rules "
        "that never refuse but put its features on the hot path: a rate limit on every tool "
        "(1,000,000 calls a minute), a budget on payments (10^12 a minute) and an approval rule "
        "that its policy's constraint always overrides; so every allowed call takes at least "
        "one counter upsert in the decision's transaction.\n",
        flush=True,
    )
    results = pc.bench_peer(config, lambda line: print(line, flush=True))
    print()
    before, after = results.before, results.after
    allowed = sum(before.outcomes)
    print(
        f"Before timing: Cerbos's own test runner decided the {results.tests_passed} calls of "
        f"the mix as expected at their fixed instants (`cerbos compile` with `now` pinned), and "
        f"our engine with the added rules did too ({results.metering_checked} calls, in "
        f"process). Over HTTP at {before.at}, on the real clock: "
        + (
            f"all {len(before.outcomes)} calls got the same answer from "
            f"{'both servers' if config.servers == 1 else 'every server'} ({allowed} allowed, "
            f"{len(before.outcomes) - allowed} denied)."
            if not before.problems
            else "THE SERVERS DISAGREE:"
        )
    )
    for problem in before.problems:
        print(f"  - {problem}")
    if before.rechecked:
        print(
            "Agreed only when asked again (a time window's edge passed between the answers): "
            + "; ".join(before.rechecked)
        )
    if after is not None:
        flipped = [
            f"{r.tool} {json.dumps(r.params)} ({'allowed' if b else 'denied'} -> "
            f"{'allowed' if a else 'denied'})"
            for r, b, a in zip(ec.REQUESTS, before.outcomes, after.outcomes, strict=True)
            if a != b
        ]
        print(
            f"After timing, at {after.at}: "
            + (
                "the servers agree on every call again"
                if not after.problems
                else "THE SERVERS DISAGREE:\n" + "\n".join(f"  - {p}" for p in after.problems)
            )
            + (
                "; calls whose answer changed in between (a time window's edge passed during "
                "the run, for both servers alike): " + "; ".join(flipped)
                if flipped
                else ", and on the same answers as before."
            )
        )
    print()
    if not results.comparisons:
        return False

    rows = []
    for c in results.comparisons:
        ours, peer = c.ours, c.peer
        per_commit = ours.per_commit
        rows.append(
            [
                str(c.concurrency),
                f"{ours.rps:,.0f}",
                f"{ours.p50_ms:.2f}",
                f"{ours.p99_ms:.2f}",
                f"{ours.cpu_micros:,.0f}",
                f"{peer.rps:,.0f}",
                f"{peer.p50_ms:.2f}",
                f"{peer.p99_ms:.2f}",
                f"{peer.cpu_micros:,.0f}",
                f"{c.ratio:.0%}",
                " ".join(f"{r:.0%}" for r in c.ratios),
                "-" if per_commit is None else f"{per_commit:.2f}",
            ]
        )
    print_table(
        [
            "concurrency",
            "ours req/s",
            "ours p50 ms",
            "ours p99 ms",
            "ours CPU µs/req",
            "Cerbos req/s",
            "Cerbos p50 ms",
            "Cerbos p99 ms",
            "Cerbos CPU µs/req",
            "ours / Cerbos",
            "each round",
            "decisions per commit",
        ],
        rows,
        text=(10,),
    )
    restarts = sum(r.restarts for c in results.comparisons for r in c.ours_runs + c.peer_runs)
    print(
        "req/s, p50, p99 and CPU are medians over the rounds (with several wrk processes, "
        "req/s is their sum and p50/p99 are of all their requests together); CPU is the user + "
        "system time of the server's processes per request (ours: each `agentauth serve` and "
        "its workers; Cerbos: its one process), wrk excluded; ours / Cerbos is the median of "
        "the rounds' ratios, each between two points measured back to back. Decisions per "
        f"commit: `{pc.BATCH_METRIC}` (sum / count) read from our `/metrics` before and after "
        "each measured run, over all rounds; - when the server does not export it. "
        + (
            f"{restarts} wrk runs were stopped after {hc.PLACEMENT_CHECK_SECONDS:g} s and "
            "started again because a worker held none of the connections"
            + (
                f" (not at concurrency {pc.SPREAD_CONCURRENCY}, where every run is kept as it "
                "fell).\n"
                if kept_at_32
                else ".\n"
            )
            if config.spread
            else "Every run was kept whatever the placement of wrk's connections.\n"
        )
    )
    shares = [
        f"c={c.concurrency}: ours {c.ours.allowed / c.ours.requests:.1%}, Cerbos "
        f"{c.peer.allowed / c.peer.requests:.1%}"
        for c in results.comparisons
        if c.ours.requests and c.peer.requests
    ]
    print(
        f"Share of allowed answers under load (the mix allowed "
        f"{allowed / len(before.outcomes):.1%} at the check): {'; '.join(shares)}.\n"
    )

    spread = next((c for c in results.comparisons if c.concurrency == pc.SPREAD_CONCURRENCY), None)
    spread_ok: bool | None = None
    if spread is not None and spread.kept_every_placement and len(spread.ours_runs) > 1:
        ours_rps = [r.rps for r in spread.ours_runs]
        peer_rps = [r.rps for r in spread.peer_runs]
        idle = sum(r.idle_worker for r in spread.ours_runs)
        print(
            f"Concurrency {spread.concurrency}, {len(ours_rps)} runs each, every run kept "
            "whatever the placement of wrk's connections on our workers:\n"
        )
        print_table(
            ["", "min / median / max", "max / min", "each run"],
            [
                ["ours req/s", pc.spread_text(ours_rps), f"{pc.max_over_min(ours_rps):.2f}",
                 " ".join(f"{v:,.0f}" for v in ours_rps)],
                ["Cerbos req/s", pc.spread_text(peer_rps), f"{pc.max_over_min(peer_rps):.2f}",
                 " ".join(f"{v:,.0f}" for v in peer_rps)],
                ["ours / Cerbos", pc.spread_text(spread.ratios, percent=True),
                 f"{pc.max_over_min(spread.ratios):.2f}",
                 " ".join(f"{v:.0%}" for v in spread.ratios)],
                ["our connections per worker", "", "",
                 " ".join(pc.placement_text(r.placement) for r in spread.ours_runs)],
            ],
            text=(0, 1, 3),
        )  # fmt: skip
        ours_spread = pc.max_over_min(ours_rps)
        peer_spread = pc.max_over_min(peer_rps)
        spread_ok = ours_spread <= peer_spread * SPREAD_MARGIN
        print(
            f"{idle} of the {len(ours_rps)} runs left one of our workers without a connection. "
            f"Cerbos is one process, so its spread is the machine's own noise in the same "
            f"minutes.\n"
        )

    growth = [c for c in results.comparisons if c.growth is not None]
    if growth:
        print(
            f"How our throughput grows with worker processes: one `agentauth serve --workers 1` "
            f"against the same database, up at the same time, its points interleaved with the "
            f"others, against the configuration above ({ours_processes} worker processes).\n"
        )
        print_table(
            ["concurrency", "1 worker process req/s", f"{ours_processes} worker processes "
             "req/s", "growth", "each round"],
            [
                [str(c.concurrency), f"{c.growth.rps:,.0f}", f"{c.ours.rps:,.0f}",
                 f"{statistics.median(c.growth_ratios):.2f}x",
                 " ".join(f"{r:.2f}x" for r in c.growth_ratios)]
                for c in growth
                if c.growth is not None
            ],
            text=(4,),
        )  # fmt: skip

    print(
        f"Audit rows in our database: {results.audit_rows:,}; authorize answers seen (wrk, "
        f"warm-ups included, and the checks): {results.answered:,}. Cerbos's audit file holds "
        f"{results.peer_decision_entries:,} decision entries for {results.peer_answered:,} "
        "answers (its file backend writes each entry with no fsync).\n"
    )
    by_c = {c.concurrency: c for c in results.comparisons}
    for concurrency in (8, 32):
        if concurrency in by_c:
            ratio = by_c[concurrency].ratio
            verdict = "Met" if ratio >= PEER_TARGET else "Below"
            print(
                f"**Throughput at concurrency {concurrency}: ours is {ratio:.0%} of Cerbos's** "
                f"(target: at least equal. {verdict})\n"
            )
    if 8 in by_c:
        ours99, peer99 = by_c[8].ours.p99_ms, by_c[8].peer.p99_ms
        verdict = "Met" if ours99 <= peer99 else "Below"
        print(
            f"**p99 at concurrency 8: ours {ours99:.2f} ms, Cerbos {peer99:.2f} ms** (target: "
            f"no worse than Cerbos's. {verdict})\n"
        )
    if spread_ok is not None and spread is not None:
        verdict = "Met" if spread_ok else "Below"
        print(
            f"**Concurrency {spread.concurrency} over {len(spread.ours_runs)} runs: ours "
            f"max/min {pc.max_over_min([r.rps for r in spread.ours_runs]):.2f}, Cerbos "
            f"{pc.max_over_min([r.rps for r in spread.peer_runs]):.2f}** (target: throughput "
            f"that does not depend on where the connections land, read here as a spread at "
            f"most {SPREAD_MARGIN - 1:.0%} wider than Cerbos's in the same runs. {verdict})\n",
        )
    bad = [
        r for c in results.comparisons for r in (*c.ours_runs, *c.peer_runs, *c.growth_runs)
        if r.unexpected or r.socket_errors
    ]  # fmt: skip
    if bad:
        print("UNEXPECTED RESPONSES OR SOCKET ERRORS: see the lines above\n")
    if results.audit_rows < results.answered:
        print("FEWER AUDIT ROWS THAN ANSWERED DECISIONS\n")
    for problem in results.problems:
        print(problem)
    return results.ok


def run_http(config: HttpConfig) -> bool:
    from bench import http_compare as hc

    print("## 2b. POST /v1/authorize over HTTP vs a bare Flask JSON endpoint\n")
    print(
        f"granian RSGI + the front, {config.workers} workers x {config.threads} threads, "
        "127.0.0.1; "
        f"wrk, 1 thread, {config.warmup:g} s warm-up + {config.seconds:g} s per point; both "
        f"servers up at once, {config.rounds} interleaved rounds per concurrency (bare, "
        "authorize, then the other way round), medians reported; SQLite WAL with "
        f"synchronous={config.synchronous or 'FULL (the default)'}, fresh database, every "
        "decision's audit row committed before the answer.\n",
        flush=True,
    )
    results = hc.bench_http(config, lambda line: print(line, flush=True))
    print()
    rows = []
    for c in results.comparisons:
        bare, authz = c.bare, c.authorize
        rows.append(
            [
                str(c.concurrency),
                f"{bare.rps:,.0f}",
                f"{bare.p50_ms:.2f}",
                f"{bare.p99_ms:.2f}",
                f"{bare.cpu_micros:,.0f}",
                f"{authz.rps:,.0f}",
                f"{authz.p50_ms:.2f}",
                f"{authz.p99_ms:.2f}",
                f"{authz.cpu_micros:,.0f}",
                f"{c.ratio:.0%}",
                " ".join(f"{r:.0%}" for r in c.ratios),
            ]
        )
    print_table(
        [
            "concurrency",
            "bare req/s",
            "bare p50 ms",
            "bare p99 ms",
            "bare CPU µs/req",
            "authorize req/s",
            "authorize p50 ms",
            "authorize p99 ms",
            "authorize CPU µs/req",
            "authorize / bare",
            "each round",
        ],
        rows,
        text=(10,),
    )
    chained = [c for c in results.comparisons if c.unchained is not None]
    if chained:
        print(
            "What the audit chain costs: the same service with the chain's work taken out "
            "(bench/unchained_app.py), up at the same time, its points interleaved with the "
            "others.\n"
        )
        print_table(
            [
                "concurrency",
                "without chain req/s",
                "p99 ms",
                "CPU µs/req",
                "with chain req/s",
                "p99 ms",
                "CPU µs/req",
                "with / without",
                "each round",
            ],
            [
                [
                    str(c.concurrency),
                    f"{c.unchained.rps:,.0f}",
                    f"{c.unchained.p99_ms:.2f}",
                    f"{c.unchained.cpu_micros:,.0f}",
                    f"{c.authorize.rps:,.0f}",
                    f"{c.authorize.p99_ms:.2f}",
                    f"{c.authorize.cpu_micros:,.0f}",
                    f"{statistics.median(c.chain_ratios):.0%}",
                    " ".join(f"{r:.0%}" for r in c.chain_ratios),
                ]
                for c in chained
                if c.unchained is not None
            ],
            text=(8,),
        )
        worst = min(statistics.median(c.chain_ratios) for c in chained)
        verdict = "meets" if worst >= CHAIN_TARGET else "BELOW"
        print(
            f"**Authorize with the chain, at worst {worst:.0%} of the throughput without it** "
            f"(target >= {CHAIN_TARGET:.0%}: {verdict} target)\n"
        )
    restarts = sum(c.restarts for c in results.comparisons)
    print(
        "req/s, p50, p99 and CPU are medians over the rounds; CPU is the user + system time of "
        "the server's processes (granian master and workers) per request, wrk excluded; "
        "authorize / bare is the median of the rounds' ratios, each taken between the two "
        "points measured back to back. "
        + (
            f"{restarts} wrk runs were stopped after {hc.PLACEMENT_CHECK_SECONDS:g} s and started "
            "again because a worker held none of the connections (see README).\n"
            if config.spread
            else "Points were kept whatever the placement of wrk's connections.\n"
        )
    )
    print(
        f"Audit rows in the database: {results.audit_rows:,}; authorize responses seen by wrk "
        f"(warm-ups included) plus the check request: {results.answered:,}.\n"
    )
    by_c = {c.concurrency: c for c in results.comparisons}
    if 8 in by_c:
        ratio = by_c[8].ratio
        verdict = "meets" if ratio >= HTTP_TARGET else "BELOW"
        print(
            f"**Ratio at concurrency 8: {ratio:.0%} of the bare endpoint's throughput** "
            f"(target >= {HTTP_TARGET:.0%}: {verdict} target)\n",
            flush=True,
        )
    points = [
        p for c in results.comparisons for p in (c.bare, c.authorize, c.unchained) if p is not None
    ]
    bad = [p for p in points if p.unexpected or p.socket_errors]
    if bad:
        print("UNEXPECTED RESPONSES OR SOCKET ERRORS: see the lines above")
    if results.audit_rows < results.answered:
        print("FEWER AUDIT ROWS THAN ANSWERED DECISIONS")
        return False
    return not bad


def run_profile(requests: int, threads: int) -> None:
    from bench import http_compare as hc

    print("## 3. Where an authorize request's time goes (in-process, one thread)\n")
    profile = hc.profile_authorize(requests, threads)
    print(
        f"{profile.requests} requests through Flask's test client (no HTTP server, no "
        f"contention): {profile.total_micros:,.0f} µs each "
        f"({1e6 / profile.total_micros:,.0f} req/s on one thread), of which "
        f"{profile.cpu_micros:,.0f} µs of CPU (both threads, timers included; the rest is "
        f"waiting, mostly for the fsync). Decisions per group transaction: "
        f"{profile.batch_size:.2f}.\n"
    )
    rows = []
    for phase in profile.phases:
        label = "· " * phase.depth + phase.label
        rows.append(
            [
                label,
                f"{phase.micros:,.0f}",
                f"{phase.micros / profile.total_micros:.0%}",
                "" if phase.calls is None else f"{phase.calls:.2f}",
            ]
        )
    print_table(["phase", "µs/request", "share", "calls/request"], rows)
    print(
        "Rows with no calls/request are differences: a phase minus the rows timed inside it. "
        "The key lookup, the decision and the batch run on the recorder's thread "
        "(core.hotpath.recorder), while the request's thread waits for them.\n"
    )
    if profile.missing:
        print(f"Not measured (not found in the app): {', '.join(profile.missing)}.\n")
    if profile.lock_micros > 0:
        print(
            f"SQLite's write lock is held {profile.lock_micros:,.0f} µs per request (end of "
            f"BEGIN IMMEDIATE to end of COMMIT, one group transaction per decision here): one "
            f"database file serialises that, so without batching about "
            f"{1e6 / profile.lock_micros:,.0f} authorize/s would be the ceiling."
        )
    else:
        print("The write lock was not seen (no BEGIN IMMEDIATE/COMMIT through the recorder).")
    print(
        f"A raw 4 KiB append + fsync on the temp directory's disk takes "
        f"{profile.fsync_micros:,.0f} µs.\n"
    )
    c = profile.contended
    if c is not None:
        print(
            f"The same app driven by {c.threads} threads of one process at once ({c.requests} "
            f"requests, no timers), as a server worker is under load: {c.micros:,.0f} µs of "
            f"wall time and {c.cpu_micros:,.0f} µs of CPU per request "
            f"({1e6 / c.micros:,.0f} req/s), {c.batch_size:.2f} "
            f"decisions per group transaction, a batch takes {c.batch_micros:,.0f} µs on the "
            f"recorder's thread and holds the write lock {c.lock_micros * c.batch_size:,.0f} µs "
            f"({c.lock_micros:,.0f} µs per decision). What a batch sends to the driver, "
            "alone and with the other threads running (wall time per call, so it includes "
            "waiting to get the GIL back after the call released it):\n"
        )
        rows = []
        for kind, (calls, micros) in c.statements.items():
            alone = profile.statements.get(kind)
            rows.append(
                [
                    kind,
                    f"{calls:.2f}",
                    "-" if alone is None else f"{alone[1]:,.0f}",
                    f"{micros:,.0f}",
                    f"{calls * micros:,.0f}",
                ]
            )
        print_table(
            [
                "statement",
                "calls per batch",
                "µs per call, one thread",
                f"µs per call, {c.threads} threads",
                "µs per batch",
            ],
            rows,
        )
    print(
        "cProfile (a fresh app, no timers, one thread), top functions by own time, µs per "
        "request (cProfile inflates Python-heavy code):\n"
    )
    print_table(
        ["function", "own µs", "cumulative µs"],
        [[f"`{name}`", f"{own:,.1f}", f"{cum:,.1f}"] for name, own, cum in profile.top_functions],
    )


def run_plan() -> bool:
    from bench import controller_plan as cp

    print("## 4. Validate and plan a generated policy repository\n")
    print(
        f"{cp.AGENTS:,} agents x {cp.POLICIES_PER_AGENT} policies of 5 rules, one file per "
        "object; each step a fresh `agentauth` process against a fresh SQLite database.\n",
        flush=True,
    )
    times = cp.bench_plan()
    print_table(
        ["step", "seconds"],
        [
            ["`agentauth validate` (empty document cache)", f"{times.validate_cold:.2f}"],
            ["`agentauth plan` (empty cache, everything to create)", f"{times.plan_cold:.2f}"],
            [
                "`agentauth plan` again after one policy file changed",
                f"{times.plan_one_changed:.2f}",
            ],
        ],
    )
    verdict = "meets" if times.plan_cold < cp.TARGET_SECONDS else "BELOW"
    print(
        f"**Full plan of {times.files:,} files: {times.plan_cold:.2f} s** (target < "
        f"{cp.TARGET_SECONDS:.0f} s: {verdict} target); the second plan took "
        f"{times.plan_one_changed / times.plan_cold:.0%} of the first.\n",
        flush=True,
    )
    return True


def run_verify(entries: int) -> bool:
    from bench import audit_verify as av

    print("## 5. Verifying the audit log\n")
    print(
        f"{entries:,} entries written through the group-commit recorder into a fresh SQLite "
        "database, then `agentauth audit verify` against it and against its JSONL export, each "
        "a fresh process timed from start to exit.\n",
        flush=True,
    )
    times = av.bench_verify(entries)

    def timing(seconds: list[float]) -> list[str]:
        ordered = sorted(seconds)
        median = statistics.median(ordered)
        spread = f"{ordered[0]:.1f}-{ordered[-1]:.1f}"
        rates = f"{entries / ordered[-1]:,.0f}-{entries / ordered[0]:,.0f}"
        return [f"{median:.1f} ({spread})", f"{entries / median:,.0f} ({rates})"]

    print_table(
        ["step", f"seconds, median of {av.ROUNDS} (min-max)", "entries/s"],
        [
            ["write (recorder, 5,000 a batch)", f"{times.write_seconds:.1f}",
             f"{entries / times.write_seconds:,.0f}"],
            ["`audit verify --db`", *timing(times.database_seconds)],
            [f"`audit verify --export` ({times.export_bytes / 1e6:,.0f} MB)",
             *timing(times.export_seconds)],
        ],
    )  # fmt: skip
    slowest = entries / max(
        statistics.median(times.database_seconds), statistics.median(times.export_seconds)
    )
    verdict = "meets" if slowest >= av.TARGET else "BELOW"
    print(
        f"**Verify: at least {slowest:,.0f} entries/s** (medians; target >= {av.TARGET:,}: "
        f"{verdict} target)\n",
        flush=True,
    )
    return True


def run_shadow(seconds: float, rounds: int) -> None:
    from bench import shadow_cost

    print("## 7. What a policy on trial costs a decision\n")
    print(
        "One `agentauth serve` on SQLite, three agents with the bench's policy: alone, with a "
        "shadow policy above it, and with a shadow policy holding a rate limit; wrk at "
        "concurrency 8 on each in turn, interleaved round by round.\n",
        flush=True,
    )
    found = shadow_cost.measure(8, seconds, rounds)
    print()
    print(shadow_cost.report(found, 8))
    print()


def run_scale(entries: int, database_url: str | None) -> None:
    from bench import audit_scale

    print("## 6. The audit log at scale\n")
    print(
        "A log written through the recorder (50 agents calling 12 of 200 tools each, 30 days), "
        "`agentauth serve` in front of it, each read asked "
        f"{audit_scale.REPEAT} times over HTTP; every total checked against `COUNT(*)`.\n",
        flush=True,
    )
    for url, store in ((None, "SQLite"), (database_url, "PostgreSQL")):
        if store == "PostgreSQL" and url is None:
            continue
        log, timings = audit_scale.bench_scale(entries, url)
        audit_scale.report(log, timings, store)


def main() -> int:
    from bench.http_compare import HttpConfig
    from bench.peer_compare import PeerConfig

    defaults = PeerConfig()
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=defaults.seconds, help="per HTTP point")
    parser.add_argument("--warmup", type=float, default=defaults.warmup, help="per HTTP point")
    parser.add_argument("--concurrency", default="1,8,32", help="HTTP points (default 1,8,32)")
    parser.add_argument(
        "--engine-seconds", type=float, default=2, help="per engine timing run, median of 3"
    )
    parser.add_argument(
        "--rounds", type=int, default=defaults.rounds, help="interleaved rounds per concurrency"
    )
    parser.add_argument(
        "--c32-runs",
        type=int,
        default=defaults.c32_runs,
        help="rounds at concurrency 32, every placement kept, reported with their spread "
        "(0: --rounds, with the placement rule of the other points)",
    )
    parser.add_argument(
        "--any-placement",
        action="store_true",
        help="keep every HTTP point, even when a worker got none of wrk's connections",
    )
    parser.add_argument(
        "--database-url",
        help="run ours against a fresh schema of this PostgreSQL (on 127.0.0.1) instead of a "
        "fresh SQLite file",
    )
    parser.add_argument(
        "--servers",
        type=int,
        default=defaults.servers,
        help="agentauth serve processes against the same database (wrk's connections split)",
    )
    parser.add_argument(
        "--growth",
        action="store_true",
        help="also measure one agentauth serve with a single worker process, interleaved",
    )
    parser.add_argument(
        "--with-bare",
        action="store_true",
        help="also compare authorize with a bare Flask endpoint on our server setup",
    )
    parser.add_argument(
        "--with-chain-cost",
        action="store_true",
        help="with --with-bare: also run authorize without the audit chain's work",
    )
    parser.add_argument("--profile-requests", type=int, default=2000)
    parser.add_argument(
        "--profile-threads",
        type=int,
        default=defaults.threads,
        help="threads of the contended profile pass (default: a server worker's threads)",
    )
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=["engines", "http", "profile", "plan", "verify", "scale", "shadow"],
    )
    parser.add_argument(
        "--scale-entries",
        type=int,
        default=1_000_000,
        help="the audit log the reads at scale are timed on (with --database-url: PostgreSQL too)",
    )
    parser.add_argument(
        "--verify-entries", type=int, default=1_000_000, help="the audit log verify measures"
    )
    experiments = parser.add_argument_group("experiments (RESULTS.md uses the defaults)")
    experiments.add_argument("--workers", type=int, default=defaults.workers)
    experiments.add_argument("--threads", type=int, default=defaults.threads)
    experiments.add_argument(
        "--synchronous", choices=["FULL", "NORMAL", "OFF"], help="AGENTAUTH_SQLITE_SYNCHRONOUS"
    )
    args = parser.parse_args()
    if args.servers < 1 or args.workers < 1 or args.threads < 1:
        parser.error("--servers, --workers and --threads must be at least 1")
    concurrencies = tuple(int(c) for c in args.concurrency.split(","))
    peer = PeerConfig(
        concurrencies=concurrencies,
        seconds=args.seconds,
        warmup=args.warmup,
        rounds=args.rounds,
        c32_runs=max(0, args.c32_runs),
        spread=not args.any_placement,
        workers=args.workers,
        threads=args.threads,
        synchronous=args.synchronous,
        database_url=args.database_url,
        servers=args.servers,
        growth=args.growth,
    )
    bare = HttpConfig(
        concurrencies=concurrencies,
        seconds=args.seconds,
        warmup=args.warmup,
        rounds=args.rounds,
        spread=not args.any_placement,
        chain_cost=args.with_chain_cost,
        workers=args.workers,
        threads=args.threads,
        synchronous=args.synchronous,
    )

    ensure_requirements()
    if "http" not in args.skip:
        from bench.cerbos import ensure_cerbos
        from bench.http_compare import ensure_wrk

        ensure_wrk()
        ensure_cerbos()
    print("# agentauth benchmarks\n")
    print_table(["machine", ""], [[k, v] for k, v in machine()], text=(0, 1))
    ok = True
    if "engines" not in args.skip:
        ok = run_engines(args.engine_seconds) and ok
    if "http" not in args.skip:
        ok = run_peer(peer) and ok
        if args.with_bare or args.with_chain_cost:
            ok = run_http(bare) and ok
    if "profile" not in args.skip:
        run_profile(args.profile_requests, args.profile_threads)
    if "plan" not in args.skip:
        ok = run_plan() and ok
    if "verify" not in args.skip:
        ok = run_verify(args.verify_entries) and ok
    if "scale" not in args.skip:
        run_scale(args.scale_entries, args.database_url)
    if "shadow" not in args.skip:
        run_shadow(args.seconds, args.rounds)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
