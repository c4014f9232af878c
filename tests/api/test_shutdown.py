"""Graceful shutdown: SIGTERM (what ``kill``, systemd, Docker and Kubernetes send) makes a real
``agentauth serve`` stop accepting connections, lets the request in flight finish with its
decision committed and audited, and then exit 0.

"Stops accepting" is read off Linux's /proc: the worker takes its listening socket out of its
event loop (the kernel may still queue new connections until the socket is closed on exit; they
are never served). The request in flight is one whose body is still arriving: the server's
front counts it from its headers on."""

from __future__ import annotations

import http.client
import json
import os
import signal
from pathlib import Path

import pytest

import tests.server
from api import create_app
from tests.api.helpers import make_agent
from tests.conftest import Tenant, bearer
from tests.server import (
    WAIT_SECONDS,
    _processes,
    in_flight,
    is_delivery_worker,
    running_server,
    server_process,
    wait_for,
)

DEADLINE = WAIT_SECONDS  # a hang guard, never a measure of speed


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # LISTEN
                inodes.add(fields[9])
    return inodes


def _accepting(worker: int, port: int) -> bool:
    """Whether the worker's event loop watches its listening socket."""
    listeners, polls = set(), []
    inodes = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    for fd in Path(f"/proc/{worker}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except FileNotFoundError:
            continue
        if target in inodes:
            listeners.add(fd.name)
        elif target == "anon_inode:[eventpoll]":
            polls.append(fd.name)
    watched = set()
    for fd in polls:
        try:
            info = Path(f"/proc/{worker}/fdinfo/{fd}").read_text()
        except FileNotFoundError:
            continue
        watched |= {line.split()[1] for line in info.splitlines() if line.startswith("tfd:")}
    return bool(listeners & watched)


def test_sigterm_finishes_the_request_in_flight_then_exits(database_url, settings, clock):
    app = create_app(settings)
    tenant = Tenant(app, f"shutdown-{clock.moment.timestamp()}", clock)
    key = tenant.key("admin")
    client = app.test_client()
    rules = [{"type": "tool_allowlist", "tools": ["calendar.*"]}]
    agent_id = make_agent(client, bearer(key), "shutdown", rules)

    with server_process(database_url, workers=1, threads=4) as server:
        base, port = server.base, int(server.base.rsplit(":", 1)[1])
        body = json.dumps(
            {"agent_id": agent_id, "tool_name": "calendar.create", "parameters": {"day": 1}}
        ).encode()
        # a request the server is inside of: headers and half of the body sent
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=DEADLINE)
        conn.putrequest("POST", "/v1/authorize")
        conn.putheader("Authorization", f"Bearer {key}")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body[:10])
        wait_for("the request to be in flight", lambda: in_flight(base) >= 2)  # it + the scrape

        [worker] = server.workers()
        assert _accepting(worker, port)

        os.kill(server.master, signal.SIGTERM)
        wait_for("the worker to stop accepting", lambda: not _accepting(worker, port))
        assert server.process.poll() is None, "the server exited with a request in flight"

        conn.send(body[10:])
        response = conn.getresponse()
        answer = json.loads(response.read())
        conn.close()
        assert response.status == 200, answer
        assert answer["allowed"] is True
        assert server.process.wait(timeout=DEADLINE) == 0

    entries = client.get("/v1/audit-logs", query_string={"agent_id": agent_id}, headers=bearer(key))
    app.extensions["agentauth"].close()
    assert [entry["id"] for entry in entries.json["data"]] == [answer["auditId"]]


def _children(parent: int) -> set[int]:
    return {pid for pid, ppid, _ in _processes() if ppid == parent}


def _workers(master: int) -> set[int]:
    return {pid for pid in _children(master) if not is_delivery_worker(pid)}


def test_a_server_that_does_not_stop_on_sigterm_is_killed_with_every_worker(
    database_url: str, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(tests.server, "STOP_SECONDS", 0.5)
    with running_server(database_url, workers=2, threads=2) as base:
        port = f"\0{base.rsplit(':', 1)[1]}\0".encode()
        [master] = [
            pid
            for pid in _children(os.getpid())
            if port in Path(f"/proc/{pid}/cmdline").read_bytes()
        ]
        wait_for("both workers to fork", lambda: len(_workers(master)) == 2)
        server = {master, *_children(master)}
        os.kill(master, signal.SIGSTOP)  # SIGTERM stays pending: the graceful stop times out
    alive = server & {pid for pid, _, _ in _processes()}
    assert alive == set(), f"server processes {alive} outlived running_server"
