"""POST /v1/authorize against the real Cerbos server: the same policy, the same request mix.

Both servers run at once, each started here on free 127.0.0.1 ports and stopped by its PID:

- ours: ``agentauth serve`` (``--servers`` processes, each ``--workers`` x ``--threads``),
  against a fresh SQLite file (WAL, ``synchronous=FULL``) or a fresh schema of the PostgreSQL
  named by ``--database-url``; its agent gets :data:`bench.engine_compare.POLICIES` through the
  API, plus the metering rules of :data:`METERING` (a rate limit on every call and a budget and
  an approval rule on payments, with limits so high that they never refuse): so every allowed
  call takes a counter upsert, and every decision commits its audit entry before the answer.
- Cerbos 0.55.0 (:mod:`bench.cerbos`): one process, the same policies translated by
  :func:`bench.cerbos.to_cerbos`, its audit on with the file backend (access and decision logs).

Before timing, every call of :data:`bench.engine_compare.REQUESTS` goes to both servers over
HTTP and their answers must agree; after timing the check runs again. wrk then drives both with
a Lua script that cycles through the same calls in the same order, at each concurrency, in
interleaved rounds (ours then Cerbos, then the other way round). See bench/README.md.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import secrets
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from bench import cerbos
from bench import engine_compare as ec
from bench.http_compare import (
    PLACEMENT_CHECK_SECONDS,
    PLACEMENT_TRIES,
    THREADS,
    WORKERS,
    connections_per_worker,
    create_admin_key,
    ensure_wrk,
    free_port,
    http,
    running,
    server_cpu_seconds,
    server_env,
)

#: Rules added to our copy of the policies only. Each is evaluated on every call in its scope
#: and never changes an outcome, so Cerbos (which keeps no counters and has no approvals) gets
#: the policies without them:
#: - a rate limit on every tool, in the highest-priority policy: a grant takes one call from
#:   it, whichever policy grants (1,000,000 calls a minute: never reached);
#: - a budget on the payments the "payments" policy grants (10^12 a minute; its constraints
#:   already deny a missing, non-numeric or out-of-range amount, so the budget's own refusal of
#:   those never decides);
#: - an approval rule on refunds above 1,000, which that policy's constraint (at most 500)
#:   always denies first: a deny beats an escalation of the same policy.
METERING: dict[str, list[dict[str, Any]]] = {
    "guardrails": [
        {
            "type": "rate_limit",
            "tools": ["*"],
            "rateLimit": {"maxCalls": 1_000_000, "windowSeconds": 60},
        }
    ],
    "payments": [
        {
            "type": "budget",
            "tools": ["payments.refund", "payments.quote"],
            "budget": {"parameter": "amount", "max": 10**12, "windowSeconds": 60},
        },
        {
            "type": "require_approval",
            "tools": ["payments.refund"],
            "parameters": {"amount": {"max": 1000}},
        },
    ],
}
BATCH_METRIC = "agentauth_decision_batch_size"
SPREAD_CONCURRENCY = 32
CHECK_TRIES = 3  # asks per call in the equivalence check before a disagreement counts
LOOPBACK_HOSTS = (None, "", "127.0.0.1", "localhost", "::1")


def ours_policies(policies: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``policies`` with the :data:`METERING` rules appended to the policies they name."""
    out = []
    for policy in policies:
        extra = METERING.get(policy["name"], [])
        out.append({**policy, "rules": [*policy["rules"], *extra]})
    missing = set(METERING) - {p["name"] for p in policies}
    if missing:
        raise ValueError(f"METERING names policies that do not exist: {sorted(missing)}")
    return out


def check_metering(policies: Sequence[dict[str, Any]], requests: Sequence[ec.Request]) -> list[str]:
    """In process, at each request's own instant: our engine with the metering rules decides
    every request as expected, never escalates, and every allowed call is a grant pending on
    at least one counter (so it takes an upsert on the server)."""
    from core.domain.engine import Decision, NeedsApproval, PendingGrant, evaluate
    from core.domain.validation import problems_of

    problems = [
        f"policy {p['name']!r} would be refused by the API: {problem}"
        for p in policies
        for problem in problems_of("policy.json#/$defs/update", {"rules": p["rules"]})
    ]
    compiled = ec.compile_ours(policies)
    for request in requests:
        result = evaluate(compiled, request.tool, request.params, request.now)
        expected = request.expect.startswith("allow")
        if isinstance(result, NeedsApproval):
            problems.append(f"{request.tool}: escalated ({result.problem})")
        elif isinstance(result, PendingGrant):
            if not expected or not result.limits:
                problems.append(f"{request.tool}: granted, expected {request.expect!r}")
        elif isinstance(result, Decision) and result.allowed:
            problems.append(f"{request.tool}: allowed without taking any counter")
        elif expected:
            problems.append(f"{request.tool}: denied ({result.reason}), expected an allow")
    return problems


# ------------------------------------------------------------------------------- config


@dataclass(frozen=True)
class PeerConfig:
    """What to run; the defaults are ``make bench``'s."""

    concurrencies: tuple[int, ...] = (1, 8, 32)
    seconds: float = 6
    warmup: float = 1
    rounds: int = 4
    #: rounds at concurrency 32 (the spread figure); every placement is kept there
    c32_runs: int = 10
    spread: bool = True  # elsewhere: re-start a point whose connections left a worker idle
    workers: int = WORKERS
    threads: int = THREADS
    synchronous: str | None = None
    database_url: str | None = None  # None: a fresh SQLite file; else a PostgreSQL URL
    servers: int = 1  # agentauth serve processes against the same database
    growth: bool = False  # also measure one agentauth serve with a single worker process

    def rounds_at(self, concurrency: int) -> int:
        if concurrency == SPREAD_CONCURRENCY and self.c32_runs > 0:
            return self.c32_runs
        return max(1, self.rounds)

    def respread_at(self, concurrency: int) -> bool:
        """Whether a run whose connections left a worker idle is started again here."""
        if concurrency == SPREAD_CONCURRENCY and self.c32_runs > 0:
            return False
        return self.spread


# ---------------------------------------------------------------------------- wrk runs


@dataclass(frozen=True)
class Side:
    """One server (set) as wrk drives it: one wrk process per URL, the connections split."""

    name: str
    urls: tuple[str, ...]
    masters: tuple[int, ...]  # the server process behind each URL (for placement and CPU)
    script: Path
    metrics: tuple[str, ...] = ()  # bases whose /metrics hold the decision batch histogram


@dataclass(frozen=True)
class Run:
    """One measured wrk run of a side (several wrk processes at once are summed)."""

    concurrency: int
    requests: int
    rps: float
    p50_ms: float
    p99_ms: float
    unexpected: int  # not 200, or not a decision
    socket_errors: int
    allowed: int  # answers that allowed the call
    placement: tuple[tuple[int, ...], ...] = ()  # connections per worker, per server
    restarts: int = 0
    cpu_micros: float = 0.0  # CPU of the side's server processes per request
    batches: tuple[float, float] | None = None  # decisions and commits (histogram sum, count)
    seen: int = 0  # answers in this point, warm-up included (for the audit tally)

    @property
    def idle_worker(self) -> bool:
        return any(len(p) > 1 and min(p) == 0 for p in self.placement)

    @property
    def per_commit(self) -> float | None:
        if self.batches is None or self.batches[1] <= 0:
            return None
        return self.batches[0] / self.batches[1]


PERCENTILES = (
    *range(1, 100),
    *(99 + i / 10 for i in range(1, 10)),
    *(99.9 + i / 100 for i in range(1, 10)),
)


def lua_script(bodies: Sequence[str], headers: dict[str, str], decided: str, allowed: str) -> str:
    """A wrk script that sends ``bodies`` in turn (all of them, over and over, in this order),
    counts the answers that are not ``200`` with ``decided`` in the body and those holding
    ``allowed``, and prints them with the latency percentiles of :data:`PERCENTILES`."""

    def long(text: str) -> str:
        level = 0
        while f"]{'=' * level}]" in text:
            level += 1
        return f"[{'=' * level}[{text}]{'=' * level}]"

    lines = ['wrk.method = "POST"']
    lines += [f"wrk.headers[ {long(k)} ] = {long(v)}" for k, v in headers.items()]
    lines.append("local bodies = {")
    lines += [f"  {long(body)}," for body in bodies]
    lines.append("}")
    percentiles = ", ".join(f"{p:g}" for p in PERCENTILES)
    lines.append(
        f"""
local calls = {{}}
local turn = 0
local threads = {{}}
function setup(thread) table.insert(threads, thread) end
function init(args)
  unexpected = 0
  granted = 0
  for i, body in ipairs(bodies) do calls[i] = wrk.format(nil, nil, nil, body) end
end
function request()
  turn = turn % #calls + 1
  return calls[turn]
end
function response(status, headers, body)
  if status ~= 200 or not string.find(body, {long(decided)}, 1, true) then
    unexpected = unexpected + 1
  elseif string.find(body, {long(allowed)}, 1, true) then
    granted = granted + 1
  end
end
function done(summary, latency, requests)
  local u, g = 0, 0
  for _, thread in ipairs(threads) do
    u = u + thread:get("unexpected")
    g = g + thread:get("granted")
  end
  io.write(string.format("unexpected responses: %d\\n", u))
  io.write(string.format("allowed responses: %d\\n", g))
  for _, p in ipairs({{{percentiles}}}) do
    io.write(string.format("percentile %g %d\\n", p, latency:percentile(p)))
  end
end
"""
    )
    return "\n".join(lines)


@dataclass(frozen=True)
class WrkOutput:
    requests: int
    rps: float
    unexpected: int
    socket_errors: int
    allowed: int
    percentiles: dict[float, float]  # percentile: latency in µs


def parse_wrk(output: str) -> WrkOutput:
    def field(pattern: str) -> str:
        found = re.search(pattern, output, re.MULTILINE)
        if found is None:
            raise ValueError(f"wrk output lacks {pattern!r}:\n{output}")
        return found[1]

    errors = re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output
    )
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    unexpected = int(field(r"^unexpected responses: (\d+)"))
    return WrkOutput(
        requests=int(field(r"^\s*(\d+) requests in")),
        rps=float(field(r"^Requests/sec:\s*([\d.]+)")),
        unexpected=max(unexpected, int(non2xx[1]) if non2xx else 0),
        socket_errors=sum(int(n) for n in errors.groups()) if errors else 0,
        allowed=int(field(r"^allowed responses: (\d+)")),
        percentiles={
            float(p): float(v)
            for p, v in re.findall(r"^percentile ([\d.]+) (\d+)$", output, re.MULTILINE)
        },
    )


def merged_percentile(outputs: Sequence[WrkOutput], percentile: float) -> float:
    """The latency (µs) at ``percentile`` of several wrk runs' requests taken together, from
    each run's percentile grid weighted by its request count. With one run it is that run's
    own figure (wrk's rounding)."""
    total = sum(o.requests for o in outputs)
    if total == 0:
        return 0.0
    candidates = sorted({v for o in outputs for v in o.percentiles.values()})
    for value in candidates:
        share = 0.0
        for o in outputs:
            below = [p for p, v in o.percentiles.items() if v <= value]
            share += o.requests * (max(below) / 100 if below else 0.0)
        if share / total >= percentile / 100 - 1e-9:
            return value
    return candidates[-1] if candidates else 0.0


def _split(concurrency: int, parts: int) -> list[int]:
    """Connections per wrk process: as even as can be, the larger shares first."""
    return [concurrency // parts + (1 if i < concurrency % parts else 0) for i in range(parts)]


def _wrk_command(wrk: str, url: str, script: Path, connections: int, seconds: float) -> list[str]:
    # One wrk thread each: it keeps up with these servers and leaves the cores to them. wrk
    # takes whole seconds.
    seconds = max(1, math.ceil(seconds))
    return [
        wrk,
        "-t1",
        f"-c{connections}",
        f"-d{seconds:g}s",
        "--timeout",
        "10s",
        "-s",
        str(script),
        url,
    ]


def _stop(processes: Sequence[subprocess.Popen[str]]) -> None:
    for process in processes:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
    for process in processes:
        try:
            process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.communicate(timeout=10)


def _cpu(masters: Sequence[int]) -> float:
    return sum(server_cpu_seconds(m) for m in dict.fromkeys(masters))


def read_text(url: str) -> str:
    assert url.startswith("http://127.0.0.1:"), url  # loopback only
    with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310 - loopback http
        return str(answer.read().decode())


def batch_totals(bases: Sequence[str]) -> tuple[float, float] | None:
    """The decision batch histogram's sum and count, added over ``bases``' ``/metrics``;
    None when a server does not export it (or has no /metrics)."""
    total, count = 0.0, 0.0
    pattern = re.compile(rf"^{BATCH_METRIC}_(sum|count)(?:\{{[^}}]*\}})?\s+(\S+)\s*$", re.MULTILINE)
    for base in bases:
        try:
            text = read_text(base + "/metrics")
        except OSError:
            return None
        found = pattern.findall(text)
        if not found:
            return None
        for kind, value in found:
            if kind == "sum":
                total += float(value)
            else:
                count += float(value)
    return total, count


class Driver:
    """Runs wrk against sides: warm-up, then the measured run, CPU and metrics around it."""

    def __init__(self, wrk: str, config: PeerConfig, report: Callable[[str], None]) -> None:
        self.wrk, self.config, self.report = wrk, config, report

    def _start(self, side: Side, concurrency: int, seconds: float) -> list[subprocess.Popen[str]]:
        started = []
        try:
            for url, connections in zip(
                side.urls, _split(concurrency, len(side.urls)), strict=True
            ):
                if connections > 0:
                    command = _wrk_command(self.wrk, url, side.script, connections, seconds)
                    started.append(
                        subprocess.Popen(
                            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
                        )
                    )
        except BaseException:
            _stop(started)
            raise
        return started

    def _finish(self, processes: list[subprocess.Popen[str]], seconds: float) -> list[WrkOutput]:
        outputs = []
        try:
            for process in processes:
                out, err = process.communicate(timeout=seconds + 60)
                if process.returncode != 0 or err.strip():  # a script error goes to stderr
                    raise RuntimeError(f"wrk failed ({process.returncode}):\n{out}\n{err}")
                outputs.append(parse_wrk(out))
        except BaseException:
            _stop(processes)
            raise
        return outputs

    def run(self, side: Side, concurrency: int, label: str) -> Run:
        config = self.config
        seen = 0
        if config.warmup > 0:
            warm = self._start(side, concurrency, config.warmup)
            seen += sum(o.requests for o in self._finish(warm, config.warmup))
        # the connections each server gets (several wrk processes may drive the same one)
        targets: dict[tuple[str, int], int] = {}
        for url, master, share in zip(
            side.urls, side.masters, _split(concurrency, len(side.urls)), strict=True
        ):
            if share > 0:
                targets[url, master] = targets.get((url, master), 0) + share
        respread = config.respread_at(concurrency)
        for attempt in range(PLACEMENT_TRIES):
            cpu = _cpu(side.masters)
            before = batch_totals(side.metrics) if side.metrics else None
            processes = self._start(side, concurrency, config.seconds)
            try:
                time.sleep(PLACEMENT_CHECK_SECONDS)  # let wrk connect, then look where it landed
                placement = tuple(connections_per_worker(m, u) for u, m in targets)
                idle = any(
                    len(p) > 1 and connections >= len(p) and min(p) == 0
                    for p, connections in zip(placement, targets.values(), strict=True)
                )
                if respread and idle and attempt + 1 < PLACEMENT_TRIES:
                    _stop(processes)
                    continue
            except BaseException:
                _stop(processes)
                raise
            outputs = self._finish(processes, config.seconds)
            cpu = _cpu(side.masters) - cpu
            after = batch_totals(side.metrics) if before is not None else None
            requests = sum(o.requests for o in outputs)
            batches = None
            if before is not None and after is not None:
                batches = (after[0] - before[0], after[1] - before[1])
            run = Run(
                concurrency=concurrency,
                requests=requests,
                rps=sum(o.rps for o in outputs),
                p50_ms=merged_percentile(outputs, 50) / 1000,
                p99_ms=merged_percentile(outputs, 99) / 1000,
                unexpected=sum(o.unexpected for o in outputs),
                socket_errors=sum(o.socket_errors for o in outputs),
                allowed=sum(o.allowed for o in outputs),
                placement=placement,
                restarts=attempt,
                cpu_micros=cpu / requests * 1e6 if requests else 0.0,
                batches=batches,
                seen=seen + requests,
            )
            self.report(_line(label, side.name, run))
            return run
        raise AssertionError("unreachable")


def _line(label: str, name: str, run: Run) -> str:
    placement = " | ".join("+".join(map(str, p)) or "1 process" for p in run.placement)
    per_commit = run.per_commit
    return (
        f"  c={run.concurrency:<3} {label:9} {name:16} {run.rps:9,.0f} req/s  "
        f"p50 {run.p50_ms:7.2f} ms  p99 {run.p99_ms:7.2f} ms  CPU {run.cpu_micros:5,.0f} µs/req"
        f"  allowed {run.allowed / run.requests if run.requests else 0:.0%}"
        f"  connections per worker {placement or '?'}"
        + (f" (started {run.restarts + 1}x)" if run.restarts else "")
        + (f"  {per_commit:.2f} decisions/commit" if per_commit is not None else "")
        + (f"  UNEXPECTED {run.unexpected}" if run.unexpected else "")
        + (f"  socket errors {run.socket_errors}" if run.socket_errors else "")
    )


def median_run(runs: Sequence[Run]) -> Run:
    """The median of each figure over rounds; counts summed; decisions per commit over all."""
    batches: tuple[float, float] | None = None
    if runs and all(r.batches is not None for r in runs):
        batches = (
            sum(r.batches[0] for r in runs if r.batches is not None),
            sum(r.batches[1] for r in runs if r.batches is not None),
        )
    return Run(
        concurrency=runs[0].concurrency,
        requests=sum(r.requests for r in runs),
        rps=statistics.median(r.rps for r in runs),
        p50_ms=statistics.median(r.p50_ms for r in runs),
        p99_ms=statistics.median(r.p99_ms for r in runs),
        unexpected=sum(r.unexpected for r in runs),
        socket_errors=sum(r.socket_errors for r in runs),
        allowed=sum(r.allowed for r in runs),
        restarts=sum(r.restarts for r in runs),
        cpu_micros=statistics.median(r.cpu_micros for r in runs),
        batches=batches,
        seen=sum(r.seen for r in runs),
    )


# ------------------------------------------------------------------------- equivalence


@dataclass
class Equivalence:
    at: str  # when the check ran (UTC)
    outcomes: list[bool]  # allowed, per request of the mix, as both servers answered
    rechecked: list[str]  # calls that disagreed at first and agreed when asked again
    problems: list[str]  # persistent disagreements and unexpected answers
    sent_to_ours: int  # authorize requests sent (the audit tally)
    sent_to_peer: int


def check_equivalence(
    ours: Sequence[str], key: str, agent_id: str, peer: str, requests: Sequence[ec.Request]
) -> Equivalence:
    """Every call of the mix to each of our servers and to Cerbos, one after the other, each
    answer compared. Both read the real clock; a call near a time window's edge may flip
    between two answers, so a disagreement is asked again (up to CHECK_TRIES times) and counts
    only if it persists."""
    outcomes, rechecked, problems, sent, sent_to_peer = [], [], [], 0, 0
    at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    for request in requests:
        answers: list[Any] = []
        for attempt in range(CHECK_TRIES):
            answers = []
            for base in ours:
                body = {
                    "agent_id": agent_id,
                    "tool_name": request.tool,
                    "parameters": request.params,
                }
                status, answer = http("POST", base + "/v1/authorize", body, key)
                sent += 1
                if (
                    status == 200
                    and isinstance(answer, dict)
                    and isinstance(answer.get("allowed"), bool)
                ):
                    answers.append(answer["allowed"])
                else:
                    answers.append(f"{status} {answer}")
            status, answer = http(
                "POST",
                peer + "/api/check/resources",
                cerbos.check_body(request.tool, request.params),
            )
            sent_to_peer += 1
            try:
                answers.append(cerbos.allowed(answer) if status == 200 else f"{status} {answer}")
            except ValueError as exc:
                answers.append(str(exc))
            if all(isinstance(a, bool) for a in answers) and len(set(answers)) == 1:
                if attempt:
                    rechecked.append(f"{request.tool} {json.dumps(request.params)}")
                break
            time.sleep(0.2)
        else:
            names = [f"ours{'' if len(ours) == 1 else i + 1}" for i in range(len(ours))]
            shown = ", ".join(
                f"{n} {a!r}" for n, a in zip([*names, "Cerbos"], answers, strict=True)
            )
            problems.append(f"{request.tool} {json.dumps(request.params)}: {shown}")
        outcomes.append(answers[0] is True)
    return Equivalence(at, outcomes, rechecked, problems, sent, sent_to_peer)


# ---------------------------------------------------------------------------- database


@dataclass
class OurDatabase:
    url: str
    count_audit: Callable[[], int]


@contextlib.contextmanager
def our_database(config: PeerConfig, workdir: Path) -> Iterator[OurDatabase]:
    """A fresh SQLite file in ``workdir``, or a fresh schema of the PostgreSQL at
    ``config.database_url`` (every connection of the servers works in it), dropped at the end."""
    if config.database_url is None:
        path = workdir / "bench.db"

        def count_sqlite() -> int:
            with contextlib.closing(sqlite3.connect(path)) as db:
                return int(db.execute("SELECT count(*) FROM audit_log").fetchone()[0])

        yield OurDatabase(f"sqlite:///{path}", count_sqlite)
        return
    from sqlalchemy import create_engine, make_url, text

    from core.store.database import normalize_url

    base = config.database_url
    parsed = make_url(normalize_url(base))
    if parsed.get_backend_name() != "postgresql":
        raise SystemExit("--database-url must be a postgresql:// URL")
    if parsed.host not in LOOPBACK_HOSTS:
        raise SystemExit(
            f"--database-url must point at this machine (127.0.0.1), not {parsed.host}"
        )
    schema = f"agentauth_bench_{os.getpid()}_{secrets.token_hex(4)}"
    admin = create_engine(normalize_url(base))
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    separator = "&" if "?" in base else "?"
    url = f"{base}{separator}options={quote(f'-csearch_path={schema}')}&application_name={schema}"

    def count_pg() -> int:
        with admin.connect() as conn:
            query = f'SELECT count(*) FROM "{schema}".audit_log'  # noqa: S608 - our own name
            found = conn.execute(text(query)).scalar()
            return int(found or 0)

    try:
        yield OurDatabase(url, count_pg)
    finally:
        with admin.begin() as conn:
            # a connection left open (a server killed) must not block the drop
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE application_name = :name AND pid <> pg_backend_pid()"
                ),
                {"name": schema},
            )
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


# ------------------------------------------------------------------------------- bench


@dataclass
class Comparison:
    """One concurrency: each side's runs round by round, and their medians."""

    concurrency: int
    ours_runs: list[Run]
    peer_runs: list[Run]
    growth_runs: list[Run] = field(default_factory=list)
    kept_every_placement: bool = False

    @property
    def ours(self) -> Run:
        return median_run(self.ours_runs)

    @property
    def peer(self) -> Run:
        return median_run(self.peer_runs)

    @property
    def growth(self) -> Run | None:
        return median_run(self.growth_runs) if self.growth_runs else None

    @property
    def ratios(self) -> list[float]:
        return [
            o.rps / p.rps if p.rps else 0.0
            for o, p in zip(self.ours_runs, self.peer_runs, strict=True)
        ]

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios)

    @property
    def growth_ratios(self) -> list[float]:
        return [
            o.rps / g.rps if g.rps else 0.0
            for o, g in zip(self.ours_runs, self.growth_runs, strict=True)
        ]


@dataclass
class PeerResults:
    tests_passed: int  # the mix checked by Cerbos's own test runner at fixed instants
    metering_checked: int  # requests our engine checked in process with the metering rules
    before: Equivalence
    after: Equivalence | None = None  # None: not timed (the first check failed)
    comparisons: list[Comparison] = field(default_factory=list)
    audit_rows: int = 0
    answered: int = 0  # authorize answers of ours: wrk (warm-ups included) and the checks
    peer_answered: int = 0
    peer_decision_entries: int = 0  # decision lines in Cerbos's audit file
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        runs = [r for c in self.comparisons for r in (*c.ours_runs, *c.peer_runs, *c.growth_runs)]
        bad = any(r.unexpected or r.socket_errors for r in runs)
        failed_checks = self.before.problems or (self.after is not None and self.after.problems)
        return not (bad or failed_checks or self.problems or self.audit_rows < self.answered)


def bench_peer(config: PeerConfig, report: Callable[[str], None]) -> PeerResults:
    wrk = ensure_wrk()
    binary = cerbos.ensure_cerbos(report)
    workdir = Path(tempfile.mkdtemp(prefix="agentauth-peer-"))
    try:
        return _bench_peer(wrk, binary, workdir, config, report)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _serve(
    servers: contextlib.ExitStack,
    workdir: Path,
    name: str,
    url: str,
    workers: int,
    config: PeerConfig,
    env: dict[str, str],
) -> tuple[str, int]:
    base = f"http://127.0.0.1:{free_port()}"
    command = [
        sys.executable,
        "-m",
        "controller",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        base.rsplit(":", 1)[1],
        "--db",
        url,
        "--workers",
        str(workers),
        "--threads",
        str(config.threads),
    ]
    healthy = lambda: http("GET", base + "/healthz")[0] == 200  # noqa: E731
    master = servers.enter_context(running(command, env, workdir / f"{name}.log", healthy, name))
    return base, master


def _create_agent(base: str, key: str, policies: Sequence[dict[str, Any]]) -> str:
    status, agent = http("POST", base + "/v1/agents", {"name": ec.AGENT}, key)
    if status != 201:
        raise RuntimeError(f"POST /v1/agents: {status} {agent}")
    for policy in policies:
        body = {
            "agent_id": agent["id"],
            "name": policy["name"],
            "priority": policy["priority"],
            "rules": policy["rules"],
        }
        status, created = http("POST", base + "/v1/policies", body, key)
        if status != 201:
            raise RuntimeError(f"POST /v1/policies {policy['name']!r}: {status} {created}")
    return str(agent["id"])


def _bench_peer(
    wrk: str, binary: Path, workdir: Path, config: PeerConfig, report: Callable[[str], None]
) -> PeerResults:
    policies = ours_policies(ec.POLICIES)
    metering = check_metering(policies, ec.REQUESTS)
    if metering:
        raise RuntimeError("our policies with the metering rules:\n" + "\n".join(metering))
    env = server_env(config.synchronous)
    with our_database(config, workdir) as database, contextlib.ExitStack() as servers:
        key = create_admin_key(database.url, env)
        ours = [
            _serve(servers, workdir, f"serve{i + 1}", database.url, config.workers, config, env)
            for i in range(config.servers)
        ]
        agent_id = _create_agent(ours[0][0], key, policies)
        peer = servers.enter_context(
            cerbos.cerbos_server(binary, workdir, ec.POLICIES, ec.REQUESTS)
        )
        growth = None
        if config.growth:
            growth = _serve(servers, workdir, "serve-1-worker", database.url, 1, config, env)

        bases = [base for base, _ in ours]
        before = check_equivalence(bases, key, agent_id, peer.setup.base, ec.REQUESTS)
        answered = before.sent_to_ours
        if before.problems:
            return PeerResults(peer.tests_passed, len(ec.REQUESTS), before)

        ours_bodies = [
            json.dumps({"agent_id": agent_id, "tool_name": r.tool, "parameters": r.params})
            for r in ec.REQUESTS
        ]
        peer_bodies = [json.dumps(cerbos.check_body(r.tool, r.params)) for r in ec.REQUESTS]
        ours_script = workdir / "ours.lua"
        ours_script.write_text(
            lua_script(
                ours_bodies,
                {"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
                '"allowed":',
                '"allowed":true',
            )
        )
        peer_script = workdir / "cerbos.lua"
        peer_script.write_text(
            lua_script(
                peer_bodies, {"Content-Type": "application/json"}, '"EFFECT_', '"EFFECT_ALLOW"'
            )
        )
        n = config.servers
        ours_side = Side(
            "ours",
            tuple(b + "/v1/authorize" for b in bases),
            tuple(m for _, m in ours),
            ours_script,
            tuple(bases),
        )
        peer_side = Side(
            "Cerbos", (peer.setup.base + "/api/check/resources",) * n, (peer.pid,) * n, peer_script
        )
        sides = [ours_side, peer_side]
        if growth is not None:
            sides.append(
                Side(
                    "ours, 1 worker",
                    (growth[0] + "/v1/authorize",) * n,
                    (growth[1],) * n,
                    ours_script,
                    (growth[0],),
                )
            )

        driver = Driver(wrk, config, report)
        comparisons = []
        for concurrency in config.concurrencies:
            rounds = config.rounds_at(concurrency)
            kept = not config.respread_at(concurrency)
            comparison = Comparison(concurrency, [], [], kept_every_placement=kept)
            for round_ in range(rounds):
                order = sides if round_ % 2 == 0 else sides[::-1]
                for side in order:
                    if side.name.endswith("1 worker") and concurrency < 2:
                        continue  # one connection keeps one worker busy: nothing to compare
                    run = driver.run(side, concurrency, f"round {round_ + 1}")
                    if side is ours_side:
                        comparison.ours_runs.append(run)
                        answered += run.seen
                    elif side is peer_side:
                        comparison.peer_runs.append(run)
                    else:
                        comparison.growth_runs.append(run)
                        answered += run.seen
            comparisons.append(comparison)

        after = check_equivalence(bases, key, agent_id, peer.setup.base, ec.REQUESTS)
        answered += after.sent_to_ours
        peer_answered = sum(r.seen for c in comparisons for r in c.peer_runs)
        peer_answered += before.sent_to_peer + after.sent_to_peer
        audit_rows = database.count_audit()
    peer_entries = cerbos.decision_entries(peer.setup.audit_log)
    return PeerResults(
        tests_passed=peer.tests_passed,
        metering_checked=len(ec.REQUESTS),
        before=before,
        after=after,
        comparisons=comparisons,
        audit_rows=audit_rows,
        answered=answered,
        peer_answered=peer_answered,
        peer_decision_entries=peer_entries,
    )


def database_kind(config: PeerConfig) -> str:
    if config.database_url is None:
        sync = config.synchronous or "FULL (the default)"
        return f"SQLite WAL with synchronous={sync}, a fresh file"
    from sqlalchemy import make_url

    from core.store.database import normalize_url

    parsed = make_url(normalize_url(config.database_url))
    where = f"{parsed.host or 'local socket'}:{parsed.port or 5432}/{parsed.database}"
    return f"PostgreSQL at {where}, a fresh schema"


def ours_setup(config: PeerConfig) -> str:
    servers = (
        "one `agentauth serve`"
        if config.servers == 1
        else (f"{config.servers} `agentauth serve` processes on their own ports")
    )
    return (
        f"{servers}, {config.workers} worker processes x {config.threads} threads each "
        "(granian RSGI and the front, as `agentauth serve` runs by default)"
    )


def peer_setup() -> str:
    return (
        f"Cerbos {cerbos.VERSION} (`{cerbos.PACKAGE}`), one process using every core, disk "
        "store, audit on with the file backend (access and decision logs)"
    )


def spread_text(values: Sequence[float], percent: bool = False) -> str:
    """``min / median / max``."""
    ordered = sorted(values)
    shown = [ordered[0], statistics.median(ordered), ordered[-1]]
    return " / ".join(f"{v:.0%}" if percent else f"{v:,.0f}" for v in shown)


def placement_text(placement: Sequence[Sequence[int]]) -> str:
    """Connections per worker, per server: ``16+16`` or ``9+7|8+8``."""
    return "|".join("+".join(map(str, p)) or "1 process" for p in placement) or "?"


def max_over_min(values: Sequence[float]) -> float:
    low = min(values)
    return max(values) / low if low > 0 else math.inf
