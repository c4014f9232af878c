"""A real ``agentauth serve`` in a child process, on a free loopback port, for tests that need
several worker processes or a real HTTP client. Stopped by its PID when the test ends.

:func:`running_server` stops the server gracefully. :func:`server_process` is for tests that
kill it. Either way the server runs in a session of its own, so its workers can still be found
by PID after a SIGKILL of the master has orphaned them, and every one of them is gone when the
block ends.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.secrets_scan import scan_server_log

STARTUP_SECONDS = 30
STOP_SECONDS = 30  # for a graceful stop after SIGTERM, before everything is killed
KILL_SECONDS = 10


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def running_server(
    database_url: str, *, workers: int = 2, threads: int = 4, env: dict[str, str] | None = None
) -> Iterator[str]:
    """Yields the base URL once /healthz answers and every worker is up; on exit SIGTERM to the
    master, then (if it has not stopped within :data:`STOP_SECONDS`) SIGKILL to every process
    of the server."""
    with server_process(database_url, workers=workers, threads=threads, env=env) as server:
        yield server.base


def _command(database_url: str, port: int, workers: int, threads: int) -> list[str]:
    return [
        sys.executable, "-m", "controller", "serve", "--host", "127.0.0.1", "--port", str(port),
        "--db", database_url, "--workers", str(workers), "--threads", str(threads),
    ]  # fmt: skip


def _log_path(port: int) -> Path:
    return Path(tempfile.gettempdir()) / f"agentauth-test-server-{port}.log"


def _wait_until_healthy(base: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                banner = f"agentauth serving on {base}"
                assert banner in log.read_text(), f"serve did not print {banner!r}"
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)  # polling for readiness, bounded by the deadline
    raise RuntimeError(f"server did not become healthy:\n{log.read_text()}")


def stop_server(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the master of a server started in a session of its own (in-flight requests
    finish); then SIGKILL, by PID, to anything of that session still alive: a master that did
    not stop within :data:`STOP_SECONDS`, or workers it orphaned."""
    if process.poll() is None:
        _signal(process.pid, signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):  # then killed below
            process.wait(timeout=STOP_SECONDS)
    if session_members(process.pid):
        kill_session(process)


def kill_session(process: subprocess.Popen[bytes]) -> list[int]:
    """SIGKILL to the session leader ``process`` and to every other process of its session, by
    PID, leader first (so the master replaces no worker); returns the PIDs killed once
    none of them, nor any late fork, is alive."""
    killed: list[int] = []
    deadline = time.monotonic() + KILL_SECONDS
    while pids := session_members(process.pid):
        if time.monotonic() > deadline:
            raise RuntimeError(f"server processes {pids} survived SIGKILL")
        for pid in pids:
            _signal(pid, signal.SIGKILL)
            killed.append(pid)
        process.poll()  # reap the leader, so it does not linger as a zombie
        time.sleep(0.01)  # polling for the kernel to finish the kill, bounded above
    process.wait(timeout=KILL_SECONDS)
    return sorted(set(killed), key=killed.index)


@dataclass
class ServerProcess:
    """A server started by :func:`server_process`: its master (granian's) and whatever it forks."""

    process: subprocess.Popen[bytes]
    base: str
    log: Path

    @property
    def master(self) -> int:
        return self.process.pid

    def pids(self) -> list[int]:
        """The live processes of this server: the master (while alive) and every process of
        its session, its workers included, even once the master's death has orphaned them."""
        return session_members(self.master)

    def workers(self) -> list[int]:
        """The master's live child processes that are its server workers (not the webhook
        delivery worker, its other child)."""
        return [pid for pid in children(self.master) if not is_delivery_worker(pid)]

    def delivery_worker(self) -> int | None:
        """The webhook delivery worker's PID (``python -m api.outbox``), while it lives."""
        return next((pid for pid in children(self.master) if is_delivery_worker(pid)), None)

    def kill(self) -> list[int]:
        """SIGKILL to the master and to every worker, by PID, master first (so no worker is
        replaced); returns the PIDs killed once none of them, nor any late fork, is alive."""
        return kill_session(self.process)

    def stop(self) -> None:
        """See :func:`stop_server`."""
        stop_server(self.process)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@contextmanager
def server_process(
    database_url: str, *, workers: int = 2, threads: int = 4, env: dict[str, str] | None = None
) -> Iterator[ServerProcess]:
    """A server whose :class:`ServerProcess` the test may kill (yielded once /healthz answers
    and all its workers are up); on exit every process of the server is stopped, whatever
    happened."""
    port = free_port()
    log = _log_path(port)
    with log.open("wb") as out:
        process = subprocess.Popen(
            _command(database_url, port, workers, threads),
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,  # its session id is the master's PID: see session_members
        )
    server = ServerProcess(process, f"http://127.0.0.1:{port}", log)
    try:
        _wait_until_healthy(server.base, process, log)
        deadline = time.monotonic() + STARTUP_SECONDS
        while len(server.workers()) < workers:  # the first worker may answer before the last forks
            if time.monotonic() > deadline:
                raise RuntimeError(f"server did not start {workers} workers:\n{server.log_text()}")
            time.sleep(0.01)  # polling for the forks, bounded by the deadline
        yield server
    finally:
        try:
            server.stop()
            if log.exists():
                scan_server_log(log.read_text(errors="replace"))
        finally:
            log.unlink(missing_ok=True)


def children(parent: int) -> list[int]:
    """Live child processes of ``parent``."""
    return [pid for pid, ppid, _ in _processes() if ppid == parent]


def is_delivery_worker(pid: int) -> bool:
    """Whether ``pid`` is the webhook delivery worker ``agentauth serve`` starts beside its
    server workers (``python -m api.outbox``)."""
    try:
        return b"\0api.outbox\0" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False  # it exited while we looked


def session_members(session: int) -> list[int]:
    """Live (not zombie) processes whose session id is ``session``, the leader first."""
    members = [pid for pid, _, sid in _processes() if sid == session]
    return sorted(members, key=lambda pid: (pid != session, pid))


def _processes() -> Iterator[tuple[int, int, int]]:
    """(pid, parent pid, session id) of every live process, read from /proc."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # it exited while we looked
        # "pid (comm) state ppid pgrp session ...": comm may hold spaces and parentheses
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] in ("Z", "X"):
            continue  # dead, only waiting to be reaped
        yield int(entry.name), int(fields[1]), int(fields[3])


def _signal(pid: int, signum: int) -> None:
    with suppress(ProcessLookupError):  # already gone
        os.kill(pid, signum)


#: how long a test waits on an outside server's state: a hang guard, never a measure of speed
WAIT_SECONDS = 30


def in_flight(base: str) -> float:
    """``agentauth_requests_in_flight`` as the server's /metrics says (a scrape counts itself)."""
    for line in httpx.get(base + "/metrics", timeout=WAIT_SECONDS).text.splitlines():
        if line.startswith("agentauth_requests_in_flight "):
            return float(line.split()[1])
    raise AssertionError("agentauth_requests_in_flight missing from /metrics")


def wait_for(what: str, condition: Callable[[], object]) -> None:
    """Poll ``condition`` until it holds, for at most :data:`WAIT_SECONDS`."""
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        assert time.monotonic() < deadline, f"still waiting for {what} after {WAIT_SECONDS} s"
        time.sleep(0.02)  # polling an outside process's state, bounded by the deadline
