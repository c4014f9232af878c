"""A worker process killed mid-request (the OOM killer, a crash in a native library) is replaced
by the server, which goes on serving; the metrics no longer count the dead worker's request as
in flight. The server is stopped by its PID when the test ends (``tests.server``)."""

from __future__ import annotations

import os
import signal
import socket

import httpx
import pytest

from api import create_app
from core.config import Settings
from tests.conftest import FakeClock, Tenant
from tests.server import WAIT_SECONDS, in_flight, server_process, wait_for

pytestmark = pytest.mark.slow

DEADLINE = WAIT_SECONDS  # a hang guard, never a measure of speed


def test_a_killed_worker_is_replaced_and_its_request_no_longer_counted(database_url):
    app = create_app(Settings(database_url=database_url))
    key = Tenant(app, "worker-death", FakeClock()).key("admin")
    app.extensions["agentauth"].close()
    with server_process(database_url, workers=1, threads=2) as server:
        host, port = server.base.removeprefix("http://").split(":")
        [worker] = server.workers()
        with socket.create_connection((host, int(port)), timeout=DEADLINE) as held:
            # a request in flight in the worker: its headers and one byte of its body
            held.sendall(
                f"POST /v1/agents HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{".encode()
            )
            wait_for("the request to be in flight", lambda: in_flight(server.base) == 2)

            os.kill(worker, signal.SIGKILL)
            assert held.recv(1) == b""  # its connection died with it

        wait_for("a new worker", lambda: [w for w in server.workers() if w != worker])
        assert worker not in server.workers()
        with httpx.Client(timeout=DEADLINE) as client:
            wait_for("the new worker to serve", lambda: _healthy(client, server.base))
            for _ in range(5):
                assert client.get(server.base + "/healthz").status_code == 200
        assert in_flight(server.base) == 1  # the scrape itself, not the dead worker's request
        assert server.process.poll() is None


def _healthy(client: httpx.Client, base: str) -> bool:
    try:
        return client.get(base + "/healthz").status_code == 200
    except httpx.TransportError:
        return False
