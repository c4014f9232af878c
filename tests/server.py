"""A real ``agentauth serve`` in a child process, on a free loopback port, for tests that need
several worker processes or a real HTTP client. Stopped by its PID when the test ends."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.secrets_scan import scan_server_log

STARTUP_SECONDS = 30


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def running_server(
    database_url: str, *, workers: int = 2, threads: int = 4, env: dict[str, str] | None = None
) -> Iterator[str]:
    """Yields the base URL once /healthz answers; SIGTERM (then SIGKILL) on exit."""
    port = free_port()
    command = [
        sys.executable, "-m", "controller", "serve", "--host", "127.0.0.1", "--port", str(port),
        "--db", database_url, "--workers", str(workers), "--threads", str(threads),
    ]  # fmt: skip
    log = Path(tempfile.gettempdir()) / f"agentauth-test-server-{port}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_until_healthy(base, process, log)
        yield base
    finally:
        _stop(process)
        if log.exists():
            scan_server_log(log.read_text(errors="replace"))
        log.unlink(missing_ok=True)


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


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
