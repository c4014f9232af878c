"""POST /v1/authorize over HTTP against a bare Flask JSON endpoint, both behind the same gunicorn.

Each server runs on its own free 127.0.0.1 port, started here and stopped by its PID (SIGTERM,
then SIGKILL) whatever happens. agentauth runs as ``agentauth serve`` does by default (2 gthread
workers x 4 threads, SQLite in WAL mode with ``synchronous=FULL``, a fresh database file in a
temporary directory); the bare app (:mod:`bench.bare_app`) runs through the same
``api.server.serve``. ``wrk`` drives both with the same Lua script (POST body, Authorization
header) and checks every response body; its ``--latency`` report gives p50/p99.

:func:`profile_authorize` then splits one authorize request's time into phases (auth
transaction, body validation, decision transaction, commits, SQL) in-process, single-threaded.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
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
        unexpected=max(unexpected, int(non2xx[1]) if non2xx else 0),
        socket_errors=sum(int(n) for n in errors.groups()) if errors else 0,
    )


def run_wrk(wrk: str, url: str, script: Path, concurrency: int, seconds: float) -> Point:
    # One wrk thread: it keeps up with these servers and leaves the cores to them.
    command = [
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
    done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60)
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return parse_wrk(done.stdout, concurrency)


# ----------------------------------------------------------------------------- servers


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http(method: str, url: str, body: Any = None, key: str | None = None) -> tuple[int, Any]:
    """A JSON request to 127.0.0.1; ``(status, decoded body)``."""
    assert url.startswith("http://127.0.0.1:"), url  # loopback only
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)  # noqa: S310 - loopback http
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=10) as answer:  # noqa: S310
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
    command: list[str], env: dict[str, str], log: Path, ready: Callable[[], bool]
) -> Iterator[int]:
    """Start ``command``; yield its PID once ``ready()``; SIGTERM then SIGKILL it by PID."""
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while not _ready(ready):
            if process.poll() is not None:
                raise RuntimeError(
                    f"{command[2]} exited with {process.returncode}:\n{log.read_text()}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"{command[2]} did not become ready:\n{log.read_text()}")
            time.sleep(0.05)  # polling for readiness, bounded by the deadline
        yield process.pid
    finally:
        stop(process)


def _ready(check: Callable[[], bool]) -> bool:
    try:
        return check()
    except OSError:  # connection refused while gunicorn starts
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


def create_agent_and_policy(base: str, key: str) -> dict[str, Any]:
    """An agent and a policy through the API; returns the authorize body to bench with."""
    status, agent = http("POST", base + "/v1/agents", {"name": "bench-agent"}, key)
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
    other values are for experiments, not for RESULTS.md."""

    concurrencies: tuple[int, ...] = (1, 8, 32)
    seconds: float = 10
    warmup: float = 2
    workers: int = WORKERS
    threads: int = THREADS
    synchronous: str | None = None  # None: the service's default


@dataclass
class HttpResults:
    bare: list[Point]
    authorize: list[Point]
    audit_rows: int
    answered: int  # authorize responses wrk saw (warm-ups included) + the one check request


def _check_body(status: int, answer: Any, expect: str, what: str) -> None:
    if status != 200 or expect not in json.dumps(answer, separators=(",", ":")):
        raise RuntimeError(f"{what}: expected 200 with {expect}, got {status} {answer}")


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
    answered = [0]

    def sweep(url: str, script: Path, name: str) -> list[Point]:
        points = []
        for concurrency in config.concurrencies:
            if config.warmup > 0:
                answered[0] += run_wrk(wrk, url, script, concurrency, config.warmup).requests
            point = run_wrk(wrk, url, script, concurrency, config.seconds)
            answered[0] += point.requests
            report(
                f"  {name:9} c={concurrency:<3} {point.rps:9,.0f} req/s  "
                f"p50 {point.p50_ms:7.2f} ms  p99 {point.p99_ms:7.2f} ms"
                + (f"  UNEXPECTED {point.unexpected}" if point.unexpected else "")
                + (f"  socket errors {point.socket_errors}" if point.socket_errors else "")
            )
            points.append(point)
        return points

    env = server_env(config.synchronous)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    listen = ["--host", "127.0.0.1", "--port", str(port)]
    sizing = ["--workers", str(config.workers), "--threads", str(config.threads)]
    bare_cmd = [sys.executable, "-m", "bench.bare_app", *listen, *sizing]
    probe = {"agent_id": "x", "tool_name": TOOL, "parameters": PARAMETERS}
    bare_up = lambda: http("POST", base + "/v1/authorize", probe)[0] == 200  # noqa: E731
    with running(bare_cmd, env, workdir / "bare.log", bare_up):
        _check_body(*http("POST", base + "/v1/authorize", probe), '"allowed":true', "bare app")
        script = write_script(workdir / "bare.lua", probe, "svc_" + "0" * 32, '"allowed":true')
        bare = sweep(base + "/v1/authorize", script, "bare")

    database = workdir / "bench.db"
    url = f"sqlite:///{database}"
    key = create_admin_key(url, env)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    listen = ["--host", "127.0.0.1", "--port", str(port)]
    serve_cmd = [sys.executable, "-m", "controller", "serve", *listen, "--db", url, *sizing]
    answered[0] = 1  # the check request below
    with running(serve_cmd, env, workdir / "serve.log", lambda: _healthy(base)):
        body = create_agent_and_policy(base, key)
        _check_body(*http("POST", base + "/v1/authorize", body, key), '"allowed":true', "authorize")
        script = write_script(workdir / "authorize.lua", body, key, '"allowed":true')
        authorize = sweep(base + "/v1/authorize", script, "authorize")
    with contextlib.closing(sqlite3.connect(database)) as db:
        (rows,) = db.execute("SELECT count(*) FROM audit_log").fetchone()
    return HttpResults(bare, authorize, rows, answered[0])


def _healthy(base: str) -> bool:
    return http("GET", base + "/healthz")[0] == 200


# ----------------------------------------------------------------------------- profile


@dataclass
class Phase:
    label: str
    depth: int
    micros: float  # per request
    calls: float  # per request


@dataclass
class Profile:
    requests: int
    total_micros: float
    phases: list[Phase]
    lock_micros: float  # SQLite write lock held per request (BEGIN IMMEDIATE to end of COMMIT)
    fsync_micros: float
    top_functions: list[tuple[str, float, float]]  # (function, own µs, cumulative µs) a request


class _Timers:
    """Wraps functions with perf_counter timers; ``stack`` names the phase a call runs in."""

    def __init__(self) -> None:
        self.total: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.stack: list[str] = []
        self._undo: list[tuple[Any, str, Any]] = []

    def add(self, label: str, seconds: float) -> None:
        self.total[label] += seconds
        self.calls[label] += 1

    def wrap(self, owner: Any, name: str, label: str, *, per_phase: bool = False) -> None:
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            self.stack.append(label)
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.stack.pop()
                where = f"{self.stack[0]} | {label}" if per_phase and self.stack else label
                self.add(where, time.perf_counter() - start)

        setattr(owner, name, timed)
        self._undo.append((owner, name, original))

    def undo(self) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()


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


def profile_authorize(requests: int = 2000) -> Profile:
    """Where one authorize request's time goes, in-process through Flask's test client (one
    thread, no HTTP server, no contention): timers around each phase, then cProfile."""
    workdir = Path(tempfile.mkdtemp(prefix="agentauth-profile-"))
    try:
        return _profile(workdir, requests)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _profile(workdir: Path, requests: int) -> Profile:
    import cProfile
    import pstats

    from sqlalchemy import event
    from sqlalchemy.orm import Session

    import api.auth
    import api.authorize
    import core.audit
    import core.decisions
    import core.keys
    import core.limits
    from api import create_app
    from core.config import Settings
    from core.db import Database
    from core.db.migrate import upgrade

    url = f"sqlite:///{workdir / 'profile.db'}"
    key = create_admin_key(url, server_env())
    settings = Settings(database_url=url, rate_limit_per_minute=HUGE_RATE_LIMIT)
    database = Database(settings)
    upgrade(database)
    database.dispose()

    timers = _Timers()
    # before create_app: api.auth.register() picks the hook up by its module-level name
    timers.wrap(api.auth, "authenticate_request", "auth hook (before_request)")
    timers.wrap(core.keys, "authenticate", "key lookup: SELECT api_keys")
    timers.wrap(core.limits, "consume", "per-key counter: UPSERT rate_counters")
    timers.wrap(api.authorize, "read_body", "body: strict JSON parse + JSON Schema")
    timers.wrap(api.authorize, "decide", "decision (core.decisions.authorize)")
    timers.wrap(core.decisions.PolicyCache, "policies", "compiled policies (cache hit)")
    timers.wrap(core.decisions, "evaluate", "evaluate (pure engine)")
    timers.wrap(core.audit, "append", "audit append: redact + ORM add")
    timers.wrap(Session, "commit", "session.commit", per_phase=True)
    try:
        app = create_app(settings)
        engine = app.extensions["agentauth"].db.engine
        marks: dict[str, float] = {}

        def phase() -> str:
            return timers.stack[0] if timers.stack else "outside"

        @event.listens_for(engine, "before_cursor_execute")
        def _sql_start(*_args: Any) -> None:
            marks["sql"] = time.perf_counter()

        @event.listens_for(engine, "after_cursor_execute")
        def _sql_end(*_args: Any) -> None:
            timers.add(f"{phase()} | SQL", time.perf_counter() - marks["sql"])

        @event.listens_for(engine, "begin")  # after core.db's listener ran BEGIN IMMEDIATE
        def _locked(*_args: Any) -> None:
            marks["locked"] = time.perf_counter()

        @event.listens_for(engine, "commit")
        def _commit_start(*_args: Any) -> None:
            marks["commit"] = time.perf_counter()

        def _commit_end(_session: Any) -> None:
            end = time.perf_counter()
            if "commit" in marks:
                timers.add(f"{phase()} | COMMIT", end - marks.pop("commit"))
            if "locked" in marks:
                timers.add("write lock held", end - marks.pop("locked"))

        event.listen(Session, "after_commit", _commit_end)
        client = app.test_client()
        headers = {"Authorization": f"Bearer {key}"}
        answer = client.post("/v1/agents", json={"name": "profile-agent"}, headers=headers)
        agent_id = answer.get_json()["id"]
        policy = {"agent_id": agent_id, "name": "bench", "rules": BENCH_POLICY_RULES}
        client.post("/v1/policies", json=policy, headers=headers)
        body = {"agent_id": agent_id, "tool_name": TOOL, "parameters": PARAMETERS}
        for _ in range(200):  # warm: policy cache, SQLAlchemy statement caches
            assert client.post("/v1/authorize", json=body, headers=headers).get_json()["allowed"]
        timers.total.clear()
        timers.calls.clear()
        start = time.perf_counter()
        for _ in range(requests):
            client.post("/v1/authorize", json=body, headers=headers)
        elapsed = time.perf_counter() - start
        phases = _phases(timers, requests)
        locked = timers.total["write lock held"] / requests * 1e6
        event.remove(Session, "after_commit", _commit_end)
    finally:
        timers.undo()

    # cProfile on a fresh app without the timers: which functions the time is spent in
    client = create_app(settings).test_client()
    for _ in range(100):
        client.post("/v1/authorize", json=body, headers=headers)
    profiler = cProfile.Profile()
    profiled = max(1, requests // 2)
    profiler.enable()
    for _ in range(profiled):
        client.post("/v1/authorize", json=body, headers=headers)
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    top = sorted(stats.items(), key=lambda item: -item[1][2])[:12]
    per = 1e6 / profiled
    functions = [(_name(where), row[2] * per, row[3] * per) for where, row in top]
    total = elapsed / requests * 1e6
    return Profile(requests, total, phases, locked, fsync_cost(workdir), functions)


def _name(where: tuple[str, int, str]) -> str:
    file, line, func = where
    if file == "~":
        return func
    parts = Path(file).parts
    short = "/".join(
        parts[parts.index("site-packages") + 1 :] if "site-packages" in parts else parts[-2:]
    )
    return f"{short}:{line}({func})"


def _phases(timers: _Timers, requests: int) -> list[Phase]:
    def row(label: str, depth: int, key: str | None = None) -> Phase:
        key = key or label
        return Phase(label, depth, timers.total[key] / requests * 1e6, timers.calls[key] / requests)

    auth, body, decide = (
        "auth hook (before_request)",
        "body: strict JSON parse + JSON Schema",
        "decision (core.decisions.authorize)",
    )
    return [
        row(auth, 0),
        row("key lookup: SELECT api_keys", 1),
        row("per-key counter: UPSERT rate_counters", 1),
        row("SQL statements (BEGIN IMMEDIATE, SELECT, UPSERT)", 1, f"{auth} | SQL"),
        row("session.commit (ORM flush + COMMIT)", 1, f"{auth} | session.commit"),
        row("of which COMMIT (WAL append + fsync)", 2, f"{auth} | COMMIT"),
        row(body, 0),
        row(decide, 0),
        row("compiled policies (cache hit)", 1),
        row("evaluate (pure engine)", 1),
        row("audit append: redact + ORM add", 1),
        row("SQL statements (BEGIN IMMEDIATE, SELECT agent, INSERT audit)", 1, f"{decide} | SQL"),
        row("session.commit (ORM flush + COMMIT)", 1, f"{decide} | session.commit"),
        row("of which COMMIT (WAL append + fsync)", 2, f"{decide} | COMMIT"),
    ]
