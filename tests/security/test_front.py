"""The server's front (``api.serving``) as a client meets it, against the real server process:
a long answer is sent whole, from a file, and leaves nothing behind, neither on disk nor in
the next request, and an export is streamed whole, leaving nothing either; one that fails
part-way is a 500, never a cut answer that looks complete; a body cut short by its client is
refused; headers spelled with underscores do not pass for their dashed twins; HEAD answers
keep their length; HTTP/2 in clear text is not spoken (it would have no header deadline).

Every socket goes to 127.0.0.1; the server is stopped by its PID (``tests.server``)."""

from __future__ import annotations

import io
import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from api import create_app, serving
from core.config import Settings
from tests.api.helpers import make_agent
from tests.conftest import FakeClock, Tenant, bearer
from tests.server import running_server

HANG_GUARD = 30  # seconds: how long any one read may block before the test fails
BIG = 200_000  # characters of one call's parameter: a dozen calls make an export of 2 MB
CALLS = 12


@pytest.fixture(scope="module")
def served(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real server whose temporary files go to a folder of this module's own; an admin key
    of a workspace of this module's own, and an agent of it with CALLS big calls audited."""
    app = create_app(Settings(database_url=database_url))
    key = Tenant(app, "front", FakeClock()).key("admin")
    agent = make_agent(
        app.test_client(), bearer(key), "front-agent", [{"type": "tool_allowlist", "tools": ["*"]}]
    )
    app.extensions["agentauth"].close()
    spool = tmp_path_factory.mktemp("spool")
    with running_server(database_url, env={"TMPDIR": str(spool)}) as base:
        with httpx.Client(timeout=HANG_GUARD) as client:
            for i in range(CALLS):
                body = {
                    "agent_id": agent,
                    "tool_name": "big",
                    "parameters": {"i": i, "x": "x" * BIG},
                }
                answer = client.post(base + "/v1/authorize", json=body, headers=bearer(key))
                assert answer.status_code == 200, answer.text
        yield base, key, agent, spool


def _raw(base: str, data: bytes) -> bytes:
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=HANG_GUARD) as sock:
        sock.sendall(data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


@pytest.mark.slow
def test_a_long_answer_is_sent_whole_and_leaves_nothing_behind(served):
    base, key, agent, spool = served
    with httpx.Client(timeout=HANG_GUARD) as client:
        page = client.get(
            base + "/v1/audit-logs", params={"agent_id": agent, "limit": CALLS}, headers=bearer(key)
        )
        assert page.status_code == 200, page.text
        assert int(page.headers["Content-Length"]) == len(page.content) > CALLS * BIG
        assert sorted(e["parameters"]["i"] for e in page.json()["data"]) == list(range(CALLS))
        # a spooled answer has no name on disk (beside it: the server's metrics folder)
        assert [p for p in spool.iterdir() if not p.name.startswith("agentauth-metrics-")] == []

        # and nothing of the caller's request is left in the next one's
        anonymous = client.get(base + "/v1/agents")
        assert anonymous.status_code == 401
        assert not [h for h in anonymous.headers if h.lower().startswith("x-ratelimit")]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["jsonl", "csv"])
def test_an_export_is_streamed_whole_and_leaves_nothing_behind(served, kind):
    """An export is sent as it is produced (api.streaming; tests/api/test_export_stream.py):
    chunked, of no announced length, whole, through a pipe whose name is gone."""
    base, key, agent, spool = served
    with httpx.Client(timeout=HANG_GUARD) as client:
        export = client.get(
            base + "/v1/audit-logs/export",
            params={"format": kind, "agent_id": agent},
            headers=bearer(key),
        )
        assert export.status_code == 200, export.text
        assert export.headers["Transfer-Encoding"] == "chunked"
        assert "Content-Length" not in export.headers
        if kind == "jsonl":
            lines = export.content.decode().splitlines()
            assert sorted(json.loads(line)["parameters"]["i"] for line in lines) == list(
                range(CALLS)
            )
        else:
            assert len(export.content) > CALLS * BIG
        assert [p for p in spool.iterdir() if not p.name.startswith("agentauth-metrics-")] == []
        # a HEAD of it answers its headers, no body, and produces none
        head = client.head(
            base + "/v1/audit-logs/export", params={"format": kind}, headers=bearer(key)
        )
        assert (head.status_code, head.content) == (200, b"")


def test_an_answer_that_fails_part_way_is_none(tmp_path, monkeypatch):
    """In process: the app's answer raises after 2 MB (a database gone in the middle of an
    export). Nothing of it is sent: the caller answers 500."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    closed = []

    class Failing:
        def __iter__(self) -> Iterator[bytes]:
            for _ in range(32):
                yield b"y" * 65536
            raise RuntimeError("the database went away")

        def close(self) -> None:
            closed.append(True)

    def app(_environ: dict[str, Any], start_response: Any) -> Failing:
        start_response("200 OK", [("Content-Type", "text/csv")])
        return Failing()

    environ = {"REQUEST_METHOD": "GET", "wsgi.input": io.BytesIO()}
    assert serving._run(app, environ) is None
    assert closed == [True]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_body_cut_short_by_its_client_is_refused(served):
    base, key, _agent, _spool = served
    body = json.dumps({"name": "cut-short"}).encode()
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=HANG_GUARD) as sock:
        sock.sendall(
            f"POST /v1/agents HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body) + 50}\r\n\r\n".encode()
            + body
        )
        sock.shutdown(socket.SHUT_WR)  # the client is done sending, 50 bytes short
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 400 ")
    names = {a["name"] for a in httpx.get(base + "/v1/agents", headers=bearer(key)).json()["data"]}
    assert "cut-short" not in names


@pytest.mark.slow
def test_a_header_spelled_with_underscores_is_not_its_dashed_twin(served):
    base, _key, _agent, _spool = served
    answer = httpx.get(base + "/healthz", headers={"X_Request_Id": "chosen-by-underscore"})
    assert answer.headers["X-Request-Id"] != "chosen-by-underscore"
    answer = httpx.get(base + "/healthz", headers={"X-Request-Id": "chosen-by-dash"})
    assert answer.headers["X-Request-Id"] == "chosen-by-dash"


@pytest.mark.slow
def test_a_head_answer_has_the_length_of_the_get(served):
    base, _key, _agent, _spool = served
    get = httpx.get(base + "/healthz")
    head = _raw(base, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    assert f"content-length: {len(get.content)}\r\n".encode() in head.lower()


@pytest.mark.slow
def test_http2_in_clear_text_is_not_spoken(served):
    base, _key, _agent, _spool = served
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
    answer = _raw(base, preface)
    assert answer == b"" or answer.startswith(b"HTTP/1.1 4")
