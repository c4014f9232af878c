"""Slow and partial requests against the real server process (#22, finding 2).

Before: gunicorn's threaded worker read a request on the thread that would serve it, so 8 to 16
sockets sending half a request (headers without their end, or a body short of its announced
length), key or no key, held every thread, and ``/healthz`` went unanswered for as long as they
were held. Now (``api.serving``) a request reaches a thread only once it is whole: 200 such
connections of each kind are held while other clients are served; a request that announces a
body without a key is refused before its body is read; a body that does not arrive within the
read deadline gets 408 and changes nothing; headers that do not arrive within it close the
connection.

Every socket goes to 127.0.0.1 and is closed when its test ends; the servers are stopped by
PID (``tests.server``). Time-outs here are hang guards, never measures of speed: the figures
are in bench/RESULTS.md.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import httpx
import pytest

from api import create_app
from core.config import Settings
from tests.api.helpers import make_agent
from tests.conftest import FakeClock, Tenant, bearer
from tests.server import running_server

pytestmark = pytest.mark.slow

HELD = 200  # connections held open at once, as the issue asks
HANG_GUARD = 30  # seconds: how long any one read may block before the test fails
OTHERS = 10  # requests of other clients made while the connections are held


@pytest.fixture(scope="module")
def tenant(database_url: str) -> tuple[str, str]:
    """An admin key of a workspace of this module's own, and an agent allowed ``search``."""
    app = create_app(Settings(database_url=database_url))
    tenant = Tenant(app, "slow-clients", FakeClock())
    key = tenant.key("admin")
    client = app.test_client()
    rules = [{"type": "tool_allowlist", "tools": ["search"]}]
    agent_id = make_agent(client, bearer(key), "slow-agent", rules)
    app.extensions["agentauth"].close()
    return key, agent_id


@pytest.fixture(scope="module")
def patient(database_url: str, tenant: tuple[str, str]) -> Iterator[str]:
    """A server whose read deadline (600 s) outlasts every test here: what it holds stays held."""
    env = {"AGENTAUTH_READ_TIMEOUT_SECONDS": "600"}
    with running_server(database_url, workers=2, threads=4, env=env) as base:
        yield base


@pytest.fixture(scope="module")
def strict(database_url: str, tenant: tuple[str, str]) -> Iterator[str]:
    """A server with the shortest read deadline there is (1 s)."""
    env = {"AGENTAUTH_READ_TIMEOUT_SECONDS": "1"}
    with running_server(database_url, workers=1, threads=2, env=env) as base:
        yield base


def _address(base: str) -> tuple[str, int]:
    host, port = base.removeprefix("http://").split(":")
    return host, int(port)


def _open(stack: ExitStack, base: str, data: bytes) -> socket.socket:
    sock = stack.enter_context(socket.create_connection(_address(base), timeout=HANG_GUARD))
    sock.sendall(data)
    return sock


def nothing(_key: str, _agent: str) -> bytes:
    """A connection that sends nothing at all: the server keeps it (a socket, not a thread)."""
    return b""


def partial_headers(_key: str, _agent: str) -> bytes:
    return b"GET /v1/agents HTTP/1.1\r\nHost: x\r\n"


def _authorize_head(key: str | None, length: int) -> bytes:
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    return (
        f"POST /v1/authorize HTTP/1.1\r\nHost: x\r\n{auth}"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


def keyed_partial_body(key: str, _agent: str) -> bytes:
    return _authorize_head(key, 100) + b"{"


def keyless_partial_body(_key: str, _agent: str) -> bytes:
    return _authorize_head(None, 100) + b"{"


def wrong_key_partial_body(_key: str, _agent: str) -> bytes:
    """A key of the right shape that is no key of this service: only its shape is known before
    the body is read."""
    return _authorize_head("svc_" + "0" * 32, 100) + b"{"


def a_mix(key: str, agent: str) -> Callable[[int], bytes]:
    kinds = [
        nothing,
        partial_headers,
        keyed_partial_body,
        keyless_partial_body,
        wrong_key_partial_body,
    ]
    return lambda i: kinds[i % len(kinds)](key, agent)


def _unanswered(sock: socket.socket) -> bool:
    """Whether the server still holds ``sock`` open without having answered anything on it."""
    sock.settimeout(0)  # (a socket with a time-out would wait for data, MSG_DONTWAIT or not)
    try:
        sock.recv(1, socket.MSG_PEEK)
    except BlockingIOError:  # nothing to read, and not closed
        return True
    except OSError:
        return False
    finally:
        sock.settimeout(HANG_GUARD)
    return False  # an answer came, or the server closed it (b"")


def _answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of the one answer on ``sock`` (the server closes it after)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed without an answer: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "the connection closed in the middle of the answer"
        body += chunk
    return int(lines[0].split()[1]), headers, body


def _others_are_served(base: str, key: str, agent: str) -> None:
    """Other clients, on connections of their own, get their answers."""
    with httpx.Client(timeout=HANG_GUARD) as client:
        for _ in range(OTHERS):
            assert client.get(base + "/healthz").status_code == 200
        listed = client.get(base + "/v1/agents", headers=bearer(key))
        assert listed.status_code == 200
        body = {"agent_id": agent, "tool_name": "search", "parameters": {}}
        for _ in range(3):
            decided = client.post(base + "/v1/authorize", json=body, headers=bearer(key))
            assert decided.status_code == 200
            assert decided.json()["allowed"] is True


@pytest.mark.parametrize(
    "make",
    [
        lambda key, agent: lambda _i: nothing(key, agent),
        lambda key, agent: lambda _i: partial_headers(key, agent),
        lambda key, agent: lambda _i: keyed_partial_body(key, agent),
        lambda key, agent: lambda _i: wrong_key_partial_body(key, agent),
        a_mix,
    ],
    ids=[
        "nothing sent",
        "partial headers",
        "keyed partial body",
        "key-shaped partial body",
        "a mix",
    ],
)
def test_held_connections_do_not_stop_other_clients(patient, tenant, make):
    key, agent = tenant
    request = make(key, agent)
    with ExitStack() as stack:
        held = [(i, _open(stack, patient, request(i))) for i in range(HELD)]
        _others_are_served(patient, key, agent)
        # and the server really was holding them meanwhile: every request that was not
        # refused outright is still open and unanswered
        waiting = [sock for i, sock in held if request(i) != keyless_partial_body(key, agent)]
        assert waiting
        assert all(_unanswered(sock) for sock in waiting)


def test_a_body_without_a_key_is_refused_before_it_is_read(patient, tenant):
    key, agent = tenant
    with ExitStack() as stack:
        socks = [_open(stack, patient, keyless_partial_body(key, agent)) for _ in range(HELD)]
        for sock in socks:  # answered with 99 of the 100 bytes of each body still to come
            status, headers, body = _answer(sock)
            assert status == 401
            assert json.loads(body)["error"]["code"] == "UNAUTHORIZED"
            assert headers["connection"] == "close"


def test_a_body_that_never_arrives_gets_408_and_changes_nothing(strict, tenant):
    key, agent = tenant
    with httpx.Client(timeout=HANG_GUARD) as client:

        def audited() -> int:
            page = client.get(
                strict + "/v1/audit-logs", params={"agent_id": agent}, headers=bearer(key)
            )
            return int(page.json()["pagination"]["total"])

        before = audited()
        new_agent = json.dumps({"name": "never-created"}).encode()
        call = json.dumps({"agent_id": agent, "tool_name": "search", "parameters": {}}).encode()
        with ExitStack() as stack:
            create = (
                "POST /v1/agents HTTP/1.1\r\nHost: x\r\n"
                f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(new_agent)}\r\n\r\n"
            ).encode()
            held = [
                _open(stack, strict, create + new_agent[:-1]),
                _open(stack, strict, _authorize_head(key, len(call)) + call[:-1]),
            ]
            for sock in held:
                status, headers, body = _answer(sock)
                assert status == 408
                error = json.loads(body)["error"]
                assert error["code"] == "REQUEST_TIMEOUT"
                assert "1 seconds" in error["message"]
                assert headers["content-type"] == "application/json"
                assert headers["connection"] == "close"
                assert sock.recv(1) == b""  # and the connection is closed
        agents = client.get(strict + "/v1/agents", headers=bearer(key)).json()["data"]
        assert "never-created" not in {a["name"] for a in agents}
        assert audited() == before


def test_headers_that_never_end_close_the_connection(strict, tenant):
    key, agent = tenant
    with ExitStack() as stack:
        socks = [_open(stack, strict, partial_headers(key, agent)) for _ in range(20)]
        for sock in socks:  # closed at the deadline, without an answer
            assert sock.recv(65536) == b""


def test_a_request_target_too_long_is_414_in_json(patient):
    with ExitStack() as stack:
        target = "/healthz?" + "a" * 9000
        sock = _open(stack, patient, f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        status, headers, body = _answer(sock)
    assert status == 414
    assert headers["content-type"] == "application/json"
    assert json.loads(body)["error"]["code"] == "URI_TOO_LONG"


def _head_answer(base: str, extra: str) -> tuple[int, dict[str, str], bytes]:
    with ExitStack() as stack:
        sock = _open(stack, base, f"GET /healthz HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode())
        return _answer(sock)


def test_headers_too_large_are_431_in_json(patient):
    status, headers, body = _head_answer(patient, "X-Big: " + "b" * 70_000 + "\r\n")
    assert status == 431
    assert headers["content-type"] == "application/json"
    assert json.loads(body)["error"]["code"] == "HEADERS_TOO_LARGE"


def test_more_than_100_header_fields_are_a_431_and_close(patient):
    """Granian's own limit, and its answer (without a body)."""
    status, headers, _body = _head_answer(patient, "".join(f"X-F{i}: {i}\r\n" for i in range(101)))
    assert status == 431
    assert headers["connection"] == "close"


def test_a_request_the_server_cannot_parse_is_a_400(patient):
    with ExitStack() as stack:
        sock = _open(stack, patient, b"\x00\x01 garbage\r\n\r\n")
        status, _headers, _body = _answer(sock)
    assert status == 400
