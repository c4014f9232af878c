"""Request bodies in every way HTTP/1.1 frames them, against the real server process: a body over
the limit is refused with 413 whether it announces its length or comes chunked, and nothing it
asked for happens (#22, finding 8). Before, a chunked body was cut at 1 MiB and the rest ignored:
1 MiB of valid JSON padded with spaces, then garbage, created what the first MiB described."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import httpx
import pytest

from api import create_app
from core.config import Settings
from tests.conftest import FakeClock, Tenant, bearer
from tests.server import running_server

LIMIT = 1024 * 1024


@pytest.fixture(scope="module")
def served(database_url: str) -> Iterator[tuple[str, str]]:
    """A real server, and an admin key of a workspace of this module's own."""
    app = create_app(Settings(database_url=database_url))
    key = Tenant(app, "bodies", FakeClock()).key("admin")
    app.extensions["agentauth"].close()
    with running_server(database_url) as base:
        yield base, key


def exchange(base: str, head: str, body: bytes) -> tuple[int, dict]:
    """Send a raw request (``head`` without its blank line), read the whole answer."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(head.encode() + b"Connection: close\r\n\r\n" + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    _, _, payload = rest.partition(b"\r\n\r\n")
    status = int(status_line.split()[1])
    try:
        return status, json.loads(payload)
    except ValueError:
        return status, {"raw": payload[:200].decode(errors="replace")}


def chunked(data: bytes, size: int = 65536) -> bytes:
    parts = [b"%x\r\n%s\r\n" % (len(data[i : i + size]), data[i : i + size])
             for i in range(0, len(data), size)]  # fmt: skip
    return b"".join(parts) + b"0\r\n\r\n"


def padded_agent(name: str, total: int) -> bytes:
    """A valid agent body padded with spaces to ``total`` bytes."""
    body = json.dumps({"name": name}).encode()
    return body + b" " * (total - len(body))


def head(key: str, framing: str) -> str:
    return (
        "POST /v1/agents HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n{framing}"
    )


def agent_names(base: str, key: str) -> set[str]:
    answer = httpx.get(base + "/v1/agents?limit=100", headers=bearer(key), timeout=30)
    return {agent["name"] for agent in answer.json()["data"]}


@pytest.mark.parametrize("framing", ["chunked", "content-length"])
def test_a_body_past_the_limit_is_413_and_changes_nothing(served, framing):
    base, key = served
    name = f"too-long-{framing}"
    data = padded_agent(name, LIMIT) + b"garbage"
    if framing == "chunked":
        status, answer = exchange(base, head(key, "Transfer-Encoding: chunked\r\n"), chunked(data))
    else:
        status, answer = exchange(base, head(key, f"Content-Length: {len(data)}\r\n"), data)
    assert status == 413
    assert answer["error"]["code"] == "PAYLOAD_TOO_LARGE"
    assert "1 MiB" in answer["error"]["message"]
    assert name not in agent_names(base, key)


@pytest.mark.parametrize("framing", ["chunked", "content-length"])
def test_a_body_of_exactly_the_limit_is_taken(served, framing):
    base, key = served
    name = f"just-fits-{framing}"
    data = padded_agent(name, LIMIT)
    if framing == "chunked":
        status, answer = exchange(base, head(key, "Transfer-Encoding: chunked\r\n"), chunked(data))
    else:
        status, answer = exchange(base, head(key, f"Content-Length: {len(data)}\r\n"), data)
    assert status == 201, answer
    assert name in agent_names(base, key)


def test_a_small_chunked_body_is_read_whole(served):
    base, key = served
    data = json.dumps({"name": "chunked-small", "description": "in pieces"}).encode()
    status, answer = exchange(
        base, head(key, "Transfer-Encoding: chunked\r\n"), chunked(data, size=7)
    )
    assert status == 201, answer
    assert answer["description"] == "in pieces"


def test_a_chunked_authorize_call_is_decided(served):
    base, key = served
    data = json.dumps({"agent_id": "0" * 8 + "-0000-4000-8000-" + "0" * 12,
                       "tool_name": "search", "parameters": {}}).encode()  # fmt: skip
    status, answer = exchange(
        base,
        "POST /v1/authorize HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n",
        chunked(data, size=10),
    )
    assert status == 200, answer
    assert answer["allowed"] is False


@pytest.mark.parametrize(
    "bad",
    [b"zz\r\n{}\r\n0\r\n\r\n", b"2\r\n{}XX0\r\n\r\n", b"2\r\n{}\r\n0\r\nX: \x00\r\n\r\n"],
    ids=["size not hex", "chunk without its end", "trailer with a NUL"],
)
def test_a_malformed_chunked_body_is_a_4xx(served, bad):
    base, key = served
    status, answer = exchange(base, head(key, "Transfer-Encoding: chunked\r\n"), bad)
    assert 400 <= status < 500, answer


@pytest.mark.parametrize(
    ("framing", "body"),
    [
        ("Transfer-Encoding: gzip, chunked\r\n", "chunked"),
        ("Transfer-Encoding: gzip\r\n", "raw"),
        ("Transfer-Encoding: identity\r\n", "raw"),
        ("Content-Length: {n}\r\nContent-Length: 3\r\n", "raw"),
    ],
    ids=["gzip then chunked", "gzip alone", "identity", "two lengths"],
)
def test_a_body_in_a_coding_not_decoded_is_refused_and_changes_nothing(served, framing, body):
    """A coding the server would not decode is refused, not taken for plain JSON."""
    base, key = served
    name = "coded-" + framing.split(":")[0].lower() + "-" + body + str(len(framing))
    data = json.dumps({"name": name}).encode()
    sent = chunked(data) if body == "chunked" else data
    status, _answer = exchange(base, head(key, framing.format(n=len(data))), sent)
    assert status == 400
    assert name not in agent_names(base, key)


def test_a_body_with_both_a_length_and_chunks_is_framed_by_its_chunks(served):
    """The classic smuggling request: the length says 5, the chunks say more. The body is the
    chunks' (or the request is refused), never the first 5 bytes with the rest taken for a
    request of its own."""
    base, key = served
    data = json.dumps({"name": "framed-by-chunks"}).encode()
    smuggled = b"GET /v1/agents/smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
    status, answer = exchange(
        base,
        head(key, "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n"),
        chunked(data) + smuggled,
    )
    assert status in (201, 400), answer
    if status == 201:
        assert answer["name"] == "framed-by-chunks"
