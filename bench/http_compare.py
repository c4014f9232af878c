"""POST /v1/authorize over HTTP against a bare Flask JSON endpoint, both behind the same server.

Each server runs on its own free 127.0.0.1 port, started here and stopped by its PID (SIGTERM,
then SIGKILL) whatever happens. agentauth runs as ``agentauth serve`` does by default (2 gthread
workers x 4 threads, SQLite in WAL mode with ``synchronous=FULL``, a fresh database file in a
temporary directory); the bare app (:mod:`bench.bare_app`) runs through the same
``api.server.serve``. Both run at once and their points alternate (bare, authorize, then
authorize, bare, ...) so that the machine's drifting speed hits both alike; each figure is the
median over the rounds. ``wrk`` drives both with the same Lua script (POST body, Authorization
header) and checks every response body; its ``--latency`` report gives p50/p99.

:func:`profile_authorize` then splits one authorize request's time into phases in-process,
single-threaded (key lookup, body, the decision's reads, the group-commit recorder's round trip
and the statements of its transaction, the response), and runs the same requests from several
threads at once to show how many decisions share a commit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WORKERS, THREADS = 2, 4  # `agentauth serve` defaults (controller/cli.py)
STARTUP_SECONDS = 30
STOP_SECONDS = 30
HUGE_RATE_LIMIT = 1_000_000_000  # per key per minute: the per-key limit must not interfere

TOOL = "search.web"
PARAMETERS = {"query": "quarterly revenue report", "limit": 10, "lang": "en"}
BENCH_POLICY_RULES: list[dict[str, Any]] = [
    {"type": "tool_denylist", "tools": ["shell.*", "*.delete"]},
    {"type": "tool_allowlist", "tools": ["search.*", "fs.read"]},
    {
        "type": "parameter_constraint",
        "tools": ["search.*"],
        "parameters": {
            "query": {"regex": "^[\\w\\s.,-]{1,200}$"},
            "limit": {"min": 1, "max": 50},
            "lang": {"enum": ["en", "de", "fr"]},
        },
    },
    {"type": "tool_denylist", "tools": ["search.internal.*"]},
]


# -------------------------------------------------------------------------------- wrk


def ensure_wrk() -> str:
    """The path of ``wrk``; installs the Debian package when missing and running as root."""
    found = shutil.which("wrk")
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        print("wrk is missing: installing it with apt-get install -y wrk", flush=True)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "-q", "wrk"]
        if subprocess.run(install, env=env, capture_output=True).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True)
            subprocess.run(install, env=env, capture_output=True)
        found = shutil.which("wrk")
        if found:
            return found
    raise SystemExit(
        "wrk is needed for the HTTP benchmark: install it with `sudo apt-get install -y wrk` "
        "(Debian/Ubuntu) or from https://github.com/wg/wrk, then run `make bench` again"
    )


LUA = """
wrk.method = "POST"
wrk.body = [==[{body}]==]
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = [==[{authorization}]==]

local threads = {{}}
function setup(thread) table.insert(threads, thread) end
function init(args) unexpected = 0 end
function response(status, headers, body)
  if status ~= 200 or not string.find(body, [==[{expect}]==], 1, true) then
    unexpected = unexpected + 1
  end
end
function done(summary, latency, requests)
  local n = 0
  for _, thread in ipairs(threads) do n = n + thread:get("unexpected") end
  io.write(string.format("unexpected responses: %d\\n", n))
end
"""


@dataclass(frozen=True)
class Point:
    """One wrk run: throughput, latency percentiles, and anything that went wrong."""

    concurrency: int
    requests: int
    rps: float
    p50_ms: float
    p99_ms: float
    unexpected: int  # non-200 or a body without the expected text
    socket_errors: int
    placement: tuple[int, ...] = ()  # wrk's connections held by each worker process
    restarts: int = 0  # runs stopped early because a worker held none of the connections
    cpu_micros: float = 0.0  # CPU time of the server's processes per request (0: not measured)
    max_ms: float = 0.0  # the slowest call of the run


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


def _ms(text: str) -> float:
    found = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if found is None:
        raise ValueError(f"cannot read wrk latency {text!r}")
    return float(found[1]) * _UNITS[found[2]]


def parse_wrk(output: str, concurrency: int) -> Point:
    """Requests/sec, the 50%/99% lines of ``--latency``, the request count and the errors."""

    def field(pattern: str) -> str:
        found = re.search(pattern, output, re.MULTILINE)
        if found is None:
            raise ValueError(f"wrk output lacks {pattern!r}:\n{output}")
        return found[1]

    errors = re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output
    )
    unexpected = int(field(r"^unexpected responses: (\d+)"))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    return Point(
        concurrency=concurrency,
        requests=int(field(r"^\s*(\d+) requests in")),
        rps=float(field(r"^Requests/sec:\s*([\d.]+)")),
        p50_ms=_ms(field(r"^\s*50%\s+(\S+)")),
        p99_ms=_ms(field(r"^\s*99%\s+(\S+)")),
        max_ms=_ms(field(r"^\s*Latency\s+\S+\s+\S+\s+(\S+)")),
        unexpected=max(unexpected, int(non2xx[1]) if non2xx else 0),
        socket_errors=sum(int(n) for n in errors.groups()) if errors else 0,
    )


def _wrk_command(wrk: str, url: str, script: Path, concurrency: int, seconds: float) -> list[str]:
    # One wrk thread: it keeps up with these servers and leaves the cores to them.
    return [
        wrk,
        "-t1",
        f"-c{concurrency}",
        f"-d{seconds:g}s",
        "--timeout",
        "10s",
        "--latency",
        "-s",
        str(script),
        url,
    ]


def run_wrk(wrk: str, url: str, script: Path, concurrency: int, seconds: float) -> Point:
    command = _wrk_command(wrk, url, script, concurrency, seconds)
    done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60)
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return parse_wrk(done.stdout, concurrency)


PLACEMENT_TRIES = 10  # wrk starts per point, at most (a failed start costs 0.3 s)
PLACEMENT_CHECK_SECONDS = 0.3  # wrk has opened all its connections by then


def run_spread(
    wrk: str, url: str, script: Path, concurrency: int, seconds: float, master: int
) -> Point:
    """:func:`run_wrk`, but a run in which some worker holds none of wrk's
    connections is stopped after PLACEMENT_CHECK_SECONDS and started again.

    wrk opens its connections in one burst, and the first worker to wake up often
    accepts all of them: then one process serves the whole load while the other idles, and
    the point measures that accident (on 2 cores, the bare app drops from about 5,500 to about
    2,100 req/s at concurrency 8, authorize from about 950 to about 630). The same rule holds
    for both servers. After PLACEMENT_TRIES starts the last run is kept whatever its placement.
    """
    command = _wrk_command(wrk, url, script, concurrency, seconds)
    for attempt in range(PLACEMENT_TRIES):
        cpu = server_cpu_seconds(master)
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            time.sleep(PLACEMENT_CHECK_SECONDS)  # let wrk connect, then look where it landed
            placement = connections_per_worker(master, url)
            idle = len(placement) > 1 and concurrency >= len(placement) and min(placement) == 0
            if idle and attempt + 1 < PLACEMENT_TRIES:
                process.terminate()
                process.communicate(timeout=30)
                continue
            out, err = process.communicate(timeout=seconds + 60)
        except BaseException:
            process.kill()
            process.communicate()
            raise
        if process.returncode != 0:
            raise RuntimeError(f"wrk failed ({process.returncode}):\n{out}\n{err}")
        cpu = server_cpu_seconds(master) - cpu
        point = parse_wrk(out, concurrency)
        per_request = cpu / point.requests * 1e6 if point.requests else 0.0
        return dataclasses.replace(
            point, placement=placement, restarts=attempt, cpu_micros=per_request
        )
    raise AssertionError("unreachable")


_TICKS = os.sysconf("SC_CLK_TCK")


def server_cpu_seconds(master: int) -> float:
    """User + system CPU time consumed so far by ``master`` and its children (the server's
    arbiter and its workers, all their threads), from /proc."""
    total = 0
    for pid in (master, *_children(master)):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / _TICKS


def connections_per_worker(master: int, url: str) -> tuple[int, ...]:
    """How many established TCP connections to ``url``'s port each child process of
    ``master`` (the server's workers) holds, largest first; read from /proc."""
    port = int(url.split(":")[2].split("/")[0])
    established = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                    established.add(fields[9])  # inode
    counts = []
    for worker in _children(master):
        if _is_delivery_worker(worker):  # the webhook worker serves no HTTP: not a worker here
            continue
        held = 0
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{worker}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{worker}/fd/{fd}")
                    if link.startswith("socket:[") and link[8:-1] in established:
                        held += 1
        counts.append(held)
    return tuple(sorted(counts, reverse=True))


def _is_delivery_worker(pid: int) -> bool:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        return b"\0api.outbox\0" in cmdline.read()
    return False


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/stat") as stat:
                # the parent PID is the second field after the ")" closing the command name
                if int(stat.read().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
    return found


# ----------------------------------------------------------------------------- servers


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http(
    method: str, url: str, body: Any = None, key: str | None = None, timeout: float = 10
) -> tuple[int, Any]:
    """A JSON request to 127.0.0.1; ``(status, decoded body)``."""
    assert url.startswith("http://127.0.0.1:"), url  # loopback only
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)  # noqa: S310 - loopback http
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as answer:  # noqa: S310
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def server_env(synchronous: str | None = None) -> dict[str, str]:
    """The environment without any AGENTAUTH_* setting (so SQLite runs with the service's
    defaults), plus a per-key rate limit high enough not to interfere."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTAUTH_")}
    env["AGENTAUTH_RATE_LIMIT_PER_MINUTE"] = str(HUGE_RATE_LIMIT)
    if synchronous:
        env["AGENTAUTH_SQLITE_SYNCHRONOUS"] = synchronous
    return env


@contextlib.contextmanager
def running(
    command: list[str],
    env: dict[str, str],
    log: Path,
    ready: Callable[[], bool],
    name: str | None = None,
) -> Iterator[int]:
    """Start ``command``; yield its PID once ``ready()``; SIGTERM then SIGKILL it by PID.
    ``name`` names it in errors (default: the module of ``python -m module``)."""
    name = name or command[2]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while not _ready(ready):
            if process.poll() is not None:
                raise RuntimeError(
                    f"{name} exited with {process.returncode}:\n{log.read_text(errors='replace')}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{name} did not become ready:\n{log.read_text(errors='replace')}"
                )
            time.sleep(0.05)  # polling for readiness, bounded by the deadline
        yield process.pid
    finally:
        stop(process)


def _ready(check: Callable[[], bool]) -> bool:
    try:
        return check()
    except OSError:  # connection refused while the server starts
        return False


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    os.kill(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=STOP_SECONDS)
    except subprocess.TimeoutExpired:
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def create_admin_key(database_url: str, env: dict[str, str]) -> str:
    """``agentauth keys create`` (the CLI, as an operator would run it)."""
    command = [
        sys.executable,
        "-m",
        "controller",
        "keys",
        "create",
        "--name",
        "bench",
        "--scopes",
        "admin",
        "--db",
        database_url,
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    key = done.stdout.strip()
    if done.returncode != 0 or not key.startswith("svc_"):
        raise RuntimeError(f"agentauth keys create failed:\n{done.stdout}{done.stderr}")
    return key


def create_agent_and_policy(base: str, key: str, name: str = "bench-agent") -> dict[str, Any]:
    """An agent and a policy through the API; returns the authorize body to bench with."""
    status, agent = http("POST", base + "/v1/agents", {"name": name}, key)
    if status != 201:
        raise RuntimeError(f"POST /v1/agents: {status} {agent}")
    policy = {"agent_id": agent["id"], "name": "bench", "rules": BENCH_POLICY_RULES}
    status, created = http("POST", base + "/v1/policies", policy, key)
    if status != 201:
        raise RuntimeError(f"POST /v1/policies: {status} {created}")
    return {"agent_id": agent["id"], "tool_name": TOOL, "parameters": PARAMETERS}


def write_script(path: Path, body: dict[str, Any], key: str, expect: str) -> Path:
    text = LUA.format(body=json.dumps(body), authorization=f"Bearer {key}", expect=expect)
    path.write_text(text)
    return path


# ------------------------------------------------------------------------------- bench


@dataclass(frozen=True)
class HttpConfig:
    """What to run. The defaults are ``agentauth serve``'s (and SQLite's ``synchronous=FULL``);
    other values are for experiments, not for RESULTS.md.

    Both servers run at the same time and the points are interleaved: at each concurrency,
    ``rounds`` pairs of bare and authorize points (bare first in even rounds, authorize first
    in odd ones), so a drift in the machine's speed hits both alike."""

    concurrencies: tuple[int, ...] = (1, 8, 32)
    seconds: float = 6
    warmup: float = 1
    rounds: int = 4
    spread: bool = True  # re-start a point whose connections left a worker idle (run_spread)
    #: also run authorize without the audit chain's work (bench.unchained_app), to show its cost
    chain_cost: bool = False
    workers: int = WORKERS
    threads: int = THREADS
    synchronous: str | None = None  # None: the service's default


@dataclass(frozen=True)
class Comparison:
    """One concurrency: the median of each server's rounds, and each round's ratio."""

    concurrency: int
    bare: Point  # medians over the rounds (requests and errors summed)
    authorize: Point
    ratios: tuple[float, ...]  # authorize / bare, round by round (the pair measured together)
    #: authorize without the audit chain, and authorize / it round by round (chain_cost only)
    unchained: Point | None = None
    chain_ratios: tuple[float, ...] = ()

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios)

    @property
    def restarts(self) -> int:
        return self.bare.restarts + self.authorize.restarts


@dataclass
class HttpResults:
    comparisons: list[Comparison]
    audit_rows: int
    answered: int  # authorize responses wrk saw (warm-ups included) + the one check request


def _check_body(status: int, answer: Any, expect: str, what: str) -> None:
    if status != 200 or expect not in json.dumps(answer, separators=(",", ":")):
        raise RuntimeError(f"{what}: expected 200 with {expect}, got {status} {answer}")


def median_point(points: list[Point]) -> Point:
    """The median of each figure over rounds; requests, unexpected answers and errors summed."""
    return Point(
        concurrency=points[0].concurrency,
        requests=sum(p.requests for p in points),
        rps=statistics.median(p.rps for p in points),
        p50_ms=statistics.median(p.p50_ms for p in points),
        p99_ms=statistics.median(p.p99_ms for p in points),
        unexpected=sum(p.unexpected for p in points),
        socket_errors=sum(p.socket_errors for p in points),
        restarts=sum(p.restarts for p in points),
        cpu_micros=statistics.median(p.cpu_micros for p in points),
    )


def bench_http(config: HttpConfig, report: Callable[[str], None]) -> HttpResults:
    wrk = ensure_wrk()
    workdir = Path(tempfile.mkdtemp(prefix="agentauth-bench-"))
    try:
        return _bench_http(wrk, workdir, config, report)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _bench_http(
    wrk: str, workdir: Path, config: HttpConfig, report: Callable[[str], None]
) -> HttpResults:
    env = server_env(config.synchronous)
    sizing = ["--workers", str(config.workers), "--threads", str(config.threads)]
    probe = {"agent_id": "x", "tool_name": TOOL, "parameters": PARAMETERS}
    database = workdir / "bench.db"
    url = f"sqlite:///{database}"
    key = create_admin_key(url, env)

    with contextlib.ExitStack() as servers:
        bare_base = f"http://127.0.0.1:{free_port()}"
        bare_url = bare_base + "/v1/authorize"
        bare_cmd = [sys.executable, "-m", "bench.bare_app", *_listen(bare_base), *sizing]
        # a key of the right shape, as the wrk script sends: the server's front does not read
        # the body of a request that has none (api.serving)
        bare_key = "svc_" + "0" * 32
        bare_up = lambda: http("POST", bare_url, probe, bare_key)[0] == 200  # noqa: E731
        bare_master = servers.enter_context(running(bare_cmd, env, workdir / "bare.log", bare_up))
        _check_body(*http("POST", bare_url, probe, bare_key), '"allowed":true', "bare app")
        bare_script = write_script(workdir / "bare.lua", probe, bare_key, '"allowed":true')

        base = f"http://127.0.0.1:{free_port()}"
        serve_cmd = [sys.executable, "-m", "controller", "serve", *_listen(base), "--db", url]
        serve_cmd += sizing
        authz_master = servers.enter_context(
            running(serve_cmd, env, workdir / "serve.log", lambda: _healthy(base))
        )
        body = create_agent_and_policy(base, key)
        authz_url = base + "/v1/authorize"
        _check_body(*http("POST", authz_url, body, key), '"allowed":true', "authorize")
        authz_script = write_script(workdir / "authorize.lua", body, key, '"allowed":true')
        answered = 1  # the check request above
        unchained: tuple[str, int] | None = None
        if config.chain_cost:  # the same service on its own database, minus the chain
            plain_base = f"http://127.0.0.1:{free_port()}"
            plain_db = f"sqlite:///{workdir / 'unchained.db'}"
            plain_key = create_admin_key(plain_db, env)
            plain_cmd = [sys.executable, "-m", "bench.unchained_app", "serve"]
            plain_cmd += [*_listen(plain_base), "--db", plain_db, *sizing]
            plain_master = servers.enter_context(
                running(plain_cmd, env, workdir / "unchained.log", lambda: _healthy(plain_base))
            )
            plain_body = create_agent_and_policy(plain_base, plain_key)
            plain_url = plain_base + "/v1/authorize"
            _check_body(*http("POST", plain_url, plain_body, plain_key), '"allowed":true', "x")
            plain_script = write_script(
                workdir / "unchained.lua", plain_body, plain_key, '"allowed":true'
            )
            unchained = (plain_url, plain_master)

        def measure(
            name: str, url: str, script: Path, master: int, concurrency: int, round_: int
        ) -> Point:
            nonlocal answered
            seen = 0
            if config.warmup > 0:
                seen += run_wrk(wrk, url, script, concurrency, config.warmup).requests
            if config.spread:
                point = run_spread(wrk, url, script, concurrency, config.seconds, master)
            else:
                cpu = server_cpu_seconds(master)
                point = run_wrk(wrk, url, script, concurrency, config.seconds)
                cpu = server_cpu_seconds(master) - cpu
                point = dataclasses.replace(
                    point,
                    placement=connections_per_worker(master, url),
                    cpu_micros=cpu / point.requests * 1e6 if point.requests else 0.0,
                )
            if name == "authorize":
                answered += seen + point.requests
            report(
                f"  c={concurrency:<3} round {round_ + 1}  {name:9} {point.rps:9,.0f} req/s  "
                f"p50 {point.p50_ms:7.2f} ms  p99 {point.p99_ms:7.2f} ms  "
                f"server CPU {point.cpu_micros:5,.0f} µs/req  connections per worker "
                f"{'+'.join(map(str, point.placement)) or '?'}"
                + (f" (started {point.restarts + 1}x)" if point.restarts else "")
                + (f"  UNEXPECTED {point.unexpected}" if point.unexpected else "")
                + (f"  socket errors {point.socket_errors}" if point.socket_errors else "")
            )
            return point

        comparisons = []
        for concurrency in config.concurrencies:
            bare: list[Point] = []
            authz: list[Point] = []
            plain: list[Point] = []
            for round_ in range(max(1, config.rounds)):
                order = [
                    ("bare", bare_url, bare_script, bare_master, bare),
                    ("authorize", authz_url, authz_script, authz_master, authz),
                ]
                if unchained is not None:
                    order.append(("unchained", unchained[0], plain_script, unchained[1], plain))
                for name, target, script, master, into in order if round_ % 2 == 0 else order[::-1]:
                    into.append(measure(name, target, script, master, concurrency, round_))
            ratios = tuple(
                a.rps / b.rps if b.rps else 0.0 for a, b in zip(authz, bare, strict=True)
            )
            chain_ratios = tuple(
                a.rps / p.rps if p.rps else 0.0 for a, p in zip(authz, plain, strict=True)
            )
            comparisons.append(
                Comparison(
                    concurrency,
                    median_point(bare),
                    median_point(authz),
                    ratios,
                    median_point(plain) if plain else None,
                    chain_ratios,
                )
            )
    with contextlib.closing(sqlite3.connect(database)) as db:
        (rows,) = db.execute("SELECT count(*) FROM audit_log").fetchone()
    return HttpResults(comparisons, rows, answered)


def _listen(base: str) -> list[str]:
    return ["--host", "127.0.0.1", "--port", base.rsplit(":", 1)[1]]


def _healthy(base: str) -> bool:
    return http("GET", base + "/healthz")[0] == 200


# ----------------------------------------------------------------------------- profile


@dataclass
class Phase:
    label: str
    depth: int
    micros: float  # per request
    calls: float | None  # per request; None for a row computed from others


@dataclass
class Contended:
    """The same app driven by several threads at once: how group commit batches under load."""

    threads: int
    requests: int
    micros: float  # wall time per request
    cpu_micros: float  # CPU time of the process per request
    batch_size: float  # decisions per transaction (per COMMIT and fsync)
    lock_micros: float  # SQLite write lock held per request
    batch_micros: float  # one batch, by the thread leading it (in-process lock, transaction)
    statements: dict[str, tuple[float, float]]  # kind: (calls per batch, µs per call)


@dataclass
class Profile:
    requests: int
    total_micros: float
    cpu_micros: float  # CPU time of the process (all its threads) per request, timers included
    phases: list[Phase]
    lock_micros: float  # SQLite write lock held per request (BEGIN IMMEDIATE to end of COMMIT)
    batch_size: float  # decisions per group transaction in the one-thread pass
    fsync_micros: float
    top_functions: list[tuple[str, float, float]]  # (function, own µs, cumulative µs) a request
    contended: Contended | None
    statements: dict[str, tuple[float, float]]  # the one-thread pass, as in Contended
    missing: list[str]  # names the timers were meant to wrap but did not find


class _Timers:
    """Wraps functions with perf_counter timers. Each thread has its own stack, so a label
    (``stack[-1]``) says which phase a SQL statement ran in; the decision recorder's writer
    thread has a stack of its own."""

    def __init__(self) -> None:
        self.total: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.missing: list[str] = []
        self._local = threading.local()
        self._lock = threading.Lock()
        self._undo: list[tuple[Any, str, Any]] = []

    @property
    def stack(self) -> list[str]:
        stack: list[str] | None = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def add(self, label: str, seconds: float, calls: int = 1) -> None:
        with self._lock:
            self.total[label] += seconds
            self.calls[label] += calls

    def clear(self) -> None:
        with self._lock:
            self.total.clear()
            self.calls.clear()

    def micros(self, label: str, requests: int) -> float:
        return self.total.get(label, 0.0) / requests * 1e6

    def replace(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        """Set ``owner.name`` to ``make(original)``; a missing name is noted, not an error (the
        app may have moved on: the profile then shows that phase as unmeasured)."""
        original = getattr(owner, name, None)
        if original is None:
            self.missing.append(f"{getattr(owner, '__qualname__', owner)}.{name}")
            return
        setattr(owner, name, make(original))
        self._undo.append((owner, name, original))

    def wrap(self, owner: Any, name: str, label: str) -> None:
        def make(original: Any) -> Any:
            def timed(*args: Any, **kwargs: Any) -> Any:
                self.stack.append(label)
                start = time.perf_counter()
                try:
                    return original(*args, **kwargs)
                finally:
                    self.stack.pop()
                    self.add(label, time.perf_counter() - start)

            return timed

        self.replace(owner, name, make)

    def undo(self) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()


# what the recorder sends to the driver, by the start of the statement (first match wins)
_DRIVER_STATEMENTS = (
    ("BEGIN", "BEGIN IMMEDIATE"),
    ("SAVEPOINT", "SAVEPOINT"),
    ("RELEASE", "RELEASE"),
    ("ROLLBACK TO", "ROLLBACK TO"),
    ("ROLLBACK", "ROLLBACK"),
    ("COMMIT", "COMMIT"),
    ("INSERT INTO rate_counters", "UPSERT rate_counters"),
    ("INSERT INTO audit_log", "INSERT audit_log"),
)


class _TimedCursor:
    """A DB-API cursor of the recorder's raw connection, timing each statement by kind, and the
    write lock from the end of ``BEGIN IMMEDIATE`` to the end of ``COMMIT``/``ROLLBACK``."""

    def __init__(self, cursor: Any, timers: _Timers) -> None:
        self._cursor = cursor
        self._timers = timers

    def execute(self, sql: str, *args: Any) -> Any:
        return self._timed(self._cursor.execute, sql, *args)

    def executemany(self, sql: str, *args: Any) -> Any:
        return self._timed(self._cursor.executemany, sql, *args)

    def _timed(self, run: Callable[..., Any], sql: str, *args: Any) -> Any:
        kind = next((k for p, k in _DRIVER_STATEMENTS if sql.startswith(p)), "other statement")
        start = time.perf_counter()
        result = run(sql, *args)
        end = time.perf_counter()
        self._timers.add(f"driver | {kind}", end - start)
        local = self._timers._local
        if kind == "BEGIN IMMEDIATE":
            local.locked = end
        elif kind in ("COMMIT", "ROLLBACK") and getattr(local, "locked", None) is not None:
            self._timers.add("write lock held", end - local.locked)
            local.locked = None
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


class _TimedConnection:
    def __init__(self, connection: Any, timers: _Timers) -> None:
        self._connection = connection
        self._timers = timers

    def cursor(self) -> _TimedCursor:
        return _TimedCursor(self._connection.cursor(), self._timers)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)


def _time_driver(timers: _Timers) -> None:
    """Time the statements the decision recorder sends straight to the driver, and count the
    decisions per group transaction (``batch size``)."""
    from core.hotpath.recorder import Recorder

    def connect(original: Any) -> Any:
        def timed(recorder: Any) -> Any:
            return _TimedConnection(original(recorder), timers)

        return timed

    def commit_batch(original: Any) -> Any:
        def counted(recorder: Any, jobs: list[Any], *args: Any) -> Any:
            timers.add("batch size", float(len(jobs)))
            start = time.perf_counter()
            try:
                return original(recorder, jobs, *args)
            finally:
                timers.add("batch", time.perf_counter() - start)

        return counted

    timers.replace(Recorder, "_connect", connect)
    timers.replace(Recorder, "_commit_batch", commit_batch)


def _statements(timers: _Timers) -> dict[str, tuple[float, float]]:
    """What the recorder sent to the driver: (calls per batch, µs per call) by kind."""
    batches = timers.calls.get("batch size", 0)
    found = {}
    for label, seconds in timers.total.items():
        calls = timers.calls[label]
        if label.startswith("driver | ") and calls and batches:
            found[label.removeprefix("driver | ")] = (calls / batches, seconds / calls * 1e6)
    return found


def fsync_cost(directory: Path, rounds: int = 200) -> float:
    """Microseconds per 4 KiB append + fsync on the disk holding ``directory``."""
    path = directory / "fsync.probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        start = time.perf_counter()
        for _ in range(rounds):
            os.write(fd, b"x" * 4096)
            os.fsync(fd)
        return (time.perf_counter() - start) / rounds * 1e6
    finally:
        os.close(fd)
        path.unlink()


def profile_authorize(requests: int = 2000, threads: int = 8) -> Profile:
    """Where one authorize request's time goes, in-process through Flask's test client (one
    thread, no HTTP server, no contention): timers around each phase, then cProfile, then the
    same requests from ``threads`` threads at once to see how group commit batches."""
    workdir = Path(tempfile.mkdtemp(prefix="agentauth-profile-"))
    try:
        return _profile(workdir, requests, threads)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@dataclass
class _Setup:
    settings: Any
    key: str
    body: dict[str, Any]


def _setup(workdir: Path) -> _Setup:
    from api import create_app
    from core.config import Settings
    from core.store.database import Database
    from core.store.migrate import upgrade

    url = f"sqlite:///{workdir / 'profile.db'}"
    key = create_admin_key(url, server_env())
    settings = Settings(database_url=url, rate_limit_per_minute=HUGE_RATE_LIMIT)
    database = Database(settings)
    upgrade(database)
    database.dispose()
    app = create_app(settings)
    try:
        client = app.test_client()
        headers = {"Authorization": f"Bearer {key}"}
        answer = client.post("/v1/agents", json={"name": "profile-agent"}, headers=headers)
        agent_id = answer.get_json()["id"]
        policy = {"agent_id": agent_id, "name": "bench", "rules": BENCH_POLICY_RULES}
        client.post("/v1/policies", json=policy, headers=headers)
    finally:
        app.extensions["agentauth"].close()
    body = {"agent_id": agent_id, "tool_name": TOOL, "parameters": PARAMETERS}
    return _Setup(settings, key, body)


def _send(client: Any, setup: _Setup, count: int) -> None:
    headers = {"Authorization": f"Bearer {setup.key}"}
    for _ in range(count):
        answer = client.post("/v1/authorize", json=setup.body, headers=headers)
        if answer.status_code != 200 or not answer.get_json()["allowed"]:
            raise RuntimeError(f"profile: unexpected answer {answer.status_code} {answer.data!r}")


def _profile(workdir: Path, requests: int, threads: int) -> Profile:
    from sqlalchemy import event

    import api.auth
    import api.authorize
    import api.params
    import core.hotpath.decisions
    import core.store.audit
    import core.store.keys
    from api import create_app
    from core.hotpath.decisions import Outcome, PolicyCache
    from core.hotpath.reads import Reads
    from core.hotpath.recorder import Recorder

    setup = _setup(workdir)
    timers = _Timers()
    # all looked up at call time, by the authorize endpoint (api.authorize.Endpoint)
    timers.wrap(core.store.keys, "authenticate", AUTH)
    timers.wrap(Reads, "api_key", "SELECT api_keys (driver)")
    timers.wrap(Reads, "agent", "SELECT agents (driver)")
    timers.wrap(api.authorize, "parse_body", BODY)
    timers.wrap(api.params, "parse_json", "strict JSON parse")
    timers.wrap(api.params, "require_valid", "schema check")
    timers.wrap(api.authorize, "decide", DECIDE)
    timers.wrap(PolicyCache, "policies", "compiled policies (cache hit)")
    timers.wrap(Recorder, "run", ROUND_TRIP)
    timers.wrap(Recorder, "_transaction", TRANSACTION)
    timers.wrap(api.auth.KeySlot, "take", "per-key slot (KeySlot.take)")
    timers.wrap(core.hotpath.decisions, "evaluate", "evaluate (pure engine)")
    timers.wrap(core.store.audit, "entry", "audit row")
    timers.wrap(Outcome, "as_response", "response: Outcome.as_response")
    timers.wrap(api.authorize, "log_access", "access line (log_access)")
    _time_driver(timers)
    try:
        app = create_app(setup.settings)
        engine = app.extensions["agentauth"].db.engine
        started: dict[int, float] = {}

        @event.listens_for(engine, "before_cursor_execute")
        def _sql_start(*_args: Any) -> None:
            started[threading.get_ident()] = time.perf_counter()

        @event.listens_for(engine, "after_cursor_execute")
        def _sql_end(*_args: Any) -> None:
            where = timers.stack[-1] if timers.stack else "outside"
            elapsed = time.perf_counter() - started.pop(threading.get_ident())
            timers.add(f"{where} | SQL", elapsed)

        client = app.test_client()
        _send(client, setup, 200)  # warm: policy cache, statement caches, the recorder's connection
        timers.clear()
        cpu = time.process_time()
        start = time.perf_counter()
        _send(client, setup, requests)
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu
        app.extensions["agentauth"].close()
    finally:
        timers.undo()
    phases = _phases(timers, requests, elapsed / requests * 1e6)
    locked = timers.micros("write lock held", requests)
    batches = timers.calls.get("batch size", 0)
    batch_size = timers.total.get("batch size", 0.0) / batches if batches else 0.0
    statements = _statements(timers)

    functions = _cprofile(create_app(setup.settings), setup, requests)
    contended = _contended(create_app(setup.settings), setup, requests, threads)
    total = elapsed / requests * 1e6
    return Profile(
        requests,
        total,
        cpu / requests * 1e6,
        phases,
        locked,
        batch_size,
        fsync_cost(workdir),
        functions,
        contended,
        statements,
        timers.missing,
    )


def _cprofile(app: Any, setup: _Setup, requests: int) -> list[tuple[str, float, float]]:
    """cProfile without the timers, one request at a time: the request's thread and the
    recorder's thread (a profiler of its own, on for each batch), added up; the request
    thread's wait for its batch is left out (the recorder's work is counted where it runs)."""
    import cProfile
    import pstats

    from core.hotpath.recorder import Recorder

    client = app.test_client()
    _send(client, setup, 100)
    profiler, on_the_thread = cProfile.Profile(), cProfile.Profile()
    original = Recorder._commit_batch

    def profiled_batch(recorder: Recorder, entries: list[Any]) -> None:
        on_the_thread.enable()
        try:
            original(recorder, entries)
        finally:
            on_the_thread.disable()

    Recorder._commit_batch = profiled_batch  # type: ignore[method-assign,assignment]
    try:
        profiled = max(1, requests // 2)
        profiler.enable()
        _send(client, setup, profiled)
        profiler.disable()
    finally:
        Recorder._commit_batch = original  # type: ignore[method-assign]
    app.extensions["agentauth"].close()
    stats = pstats.Stats(profiler)
    stats.add(on_the_thread)
    rows = {
        where: row
        for where, row in stats.stats.items()  # type: ignore[attr-defined]
        if where[2] != "<method 'acquire' of '_thread.lock' objects>"
    }
    top = sorted(rows.items(), key=lambda item: -item[1][2])[:14]
    per = 1e6 / profiled
    return [(_name(where), row[2] * per, row[3] * per) for where, row in top]


def _contended(app: Any, setup: _Setup, requests: int, threads: int) -> Contended | None:
    """The same requests from ``threads`` threads of one process at once (no timers): wall time
    per request, decisions per group transaction and write lock held per request."""
    if threads < 2:
        return None
    timers = _Timers()
    _time_driver(timers)
    try:
        _send(app.test_client(), setup, 50)
        timers.clear()
        each = max(1, requests // threads)
        failures: list[BaseException] = []

        def work() -> None:
            try:
                _send(app.test_client(), setup, each)
            except BaseException as exc:  # reported below, after every thread has stopped
                failures.append(exc)

        workers = [threading.Thread(target=work) for _ in range(threads)]
        cpu = time.process_time()
        start = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu
        app.extensions["agentauth"].close()
    finally:
        timers.undo()
    if failures:
        raise RuntimeError(f"profile ({threads} threads): {failures[0]!r}") from failures[0]
    done = each * threads
    batches = timers.calls.get("batch size", 0)
    return Contended(
        threads,
        done,
        elapsed / done * 1e6,
        cpu / done * 1e6,
        timers.total.get("batch size", 0.0) / batches if batches else 0.0,
        timers.micros("write lock held", done),
        timers.total.get("batch", 0.0) / batches * 1e6 if batches else 0.0,
        _statements(timers),
    )


def _name(where: tuple[str, int, str]) -> str:
    file, line, func = where
    if file == "~":
        return func
    parts = Path(file).parts
    short = "/".join(
        parts[parts.index("site-packages") + 1 :] if "site-packages" in parts else parts[-2:]
    )
    return f"{short}:{line}({func})"


AUTH = "key lookup (core.store.keys.authenticate)"
BODY = "body: strict JSON parse + schema quick check"
DECIDE = "decision (core.hotpath.decisions.authorize)"
ROUND_TRIP = "recorder round trip (Recorder.run): the key, the decision and its batch"
TRANSACTION = "batch transaction (Recorder._transaction)"
_ON_THE_THREAD = (AUTH, DECIDE, TRANSACTION)
_TOP_LEVEL = (
    BODY,
    ROUND_TRIP,
    "response: Outcome.as_response",
    "access line (log_access)",
)


def _phases(timers: _Timers, requests: int, total: float) -> list[Phase]:
    """The table rows. A row that measured nothing shows 0, never an error."""

    def row(label: str, depth: int, *keys: str) -> Phase:
        keys = keys or (label,)
        micros = sum(timers.micros(k, requests) for k in keys)
        return Phase(label, depth, micros, sum(timers.calls.get(k, 0) for k in keys) / requests)

    def rest(label: str, depth: int, whole: str, *parts: str) -> Phase:
        parts_micros = sum(timers.micros(p, requests) for p in parts)
        return Phase(label, depth, max(0.0, timers.micros(whole, requests) - parts_micros), None)

    rows = [
        row(BODY, 0),
        row("strict JSON parse (api.params.parse_json)", 1, "strict JSON parse"),
        row("schema check (require_valid, jsonschema-rs)", 1, "schema check"),
        row(ROUND_TRIP, 0),
        rest("hand-offs to the recorder's thread and back", 1, ROUND_TRIP, *_ON_THE_THREAD),
        row(AUTH + ", on the recorder's thread", 1, AUTH),
        row("of which SELECT api_keys (driver)", 2, "SELECT api_keys (driver)"),
        row(DECIDE + ", its read phase", 1, DECIDE),
        row("of which SELECT agents (driver)", 2, "SELECT agents (driver)"),
        row("of which compiled policies (cache hit)", 2, "compiled policies (cache hit)"),
        row("of which evaluate (pure engine)", 2, "evaluate (pure engine)"),
        row("of which audit row: id, redact, scrub", 2, "audit row"),
        row(TRANSACTION, 1, TRANSACTION),
        row("BEGIN IMMEDIATE (and any wait for the lock)", 2, "driver | BEGIN IMMEDIATE"),
        row(
            "SAVEPOINT + RELEASE (per job, per limit set)",
            2,
            "driver | SAVEPOINT",
            "driver | RELEASE",
        ),
        row("per-key slot (KeySlot.take)", 2, "per-key slot (KeySlot.take)"),
        row("of which UPSERT rate_counters (driver)", 3, "driver | UPSERT rate_counters"),
        row("INSERT audit_log (driver, one executemany per batch)", 2, "driver | INSERT audit_log"),
        row("COMMIT (WAL append + fsync)", 2, "driver | COMMIT"),
    ]
    rows += [row(label, 0) for label in _TOP_LEVEL[2:]]
    measured = sum(timers.micros(label, requests) for label in _TOP_LEVEL)
    rows.append(
        Phase(
            "the endpoint's own work, JSON encoding, test client",
            0,
            max(0.0, total - measured),
            None,
        )
    )
    return rows
