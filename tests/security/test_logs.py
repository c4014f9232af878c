"""No log line holds an API key (#22, finding 7): not the access line, not the HTTP server's own
lines, not a traceback, not a database error, whatever part of a request the key was put in."""

from __future__ import annotations

import io
import logging
import socket
from collections.abc import Iterator

import pytest
from sqlalchemy import text

from api import create_app
from api.observe import configure_logging
from core.config import Settings
from core.domain.errors import StorageError
from core.store.database import Database
from tests.conftest import FakeClock, Tenant
from tests.server import server_process

FAKE = "svc_" + "0123456789abcdef" * 2  # a key's shape, issued to nobody


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """What the root logger's handlers write, with the service's logging configured as
    ``agentauth serve`` configures it; put back as it was afterwards."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    root, access = logging.getLogger(), logging.getLogger("agentauth.access")
    saved = (list(access.handlers), access.propagate, access.level)
    every = [*root.handlers, handler]
    filters = {id(h): list(h.filters) for h in every}
    root.addHandler(handler)
    configure_logging()
    try:
        yield out
    finally:
        root.removeHandler(handler)
        access.handlers[:], access.propagate, access.level = saved[0], saved[1], saved[2]
        for each in root.handlers:
            each.filters[:] = filters.get(id(each), each.filters)


def test_a_record_quoting_a_key_is_masked_in_message_and_traceback(captured):
    log = logging.getLogger("agentauth.api")
    try:
        raise ValueError(f"bad value {FAKE}")
    except ValueError:
        log.exception("could not handle %s", f"/v1/agents/{FAKE}")
    written = captured.getvalue()
    assert "could not handle /v1/agents/[REDACTED]" in written
    assert "ValueError: bad value [REDACTED]" in written
    assert FAKE not in written
    assert FAKE[4:] not in written


def test_a_database_error_does_not_carry_what_was_sent(database_url):
    db = Database(Settings(database_url=database_url))
    try:
        with pytest.raises(StorageError) as caught, db.connect() as connection:
            connection.execute(text("SELECT no_such_column WHERE :value = :value"), {"value": FAKE})
        cause = caught.value.__cause__
        assert cause is not None
        assert FAKE not in str(cause)
    finally:
        db.dispose()


def _send(base: str, request: bytes) -> bytes:
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def test_a_key_anywhere_in_a_request_reaches_no_log_line_and_no_answer(database_url):
    app = create_app(Settings(database_url=database_url))
    key = Tenant(app, "logs", FakeClock()).key("admin")  # issued: the secrets scan looks for it
    app.extensions["agentauth"].close()
    requests = [
        f"GET /v1/agents/{key} HTTP/1.1",  # a key pasted where an id belongs
        f"DELETE /v1/api-keys/{key} HTTP/1.1\r\nAuthorization: Bearer {key}",
        f"GET /{key}?{key}={key} HTTP/1.1",
        f"GET /v1/agents/{key} HTTP/1.1 extra",  # a request line the server refuses itself
        f"GET /v1/agents?agent_id={key} HTTP/1.1\r\nAuthorization: Bearer {key}",
        f"GET /healthz HTTP/1.1\r\nX-Request-Id: {key}\r\n{key}: x",
    ]
    with server_process(database_url) as server:
        for line in requests:
            answer = _send(server.base, f"{line}\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            assert answer.startswith(b"HTTP/1.1 "), answer[:100]
            assert key.encode() not in answer
            assert key[4:].encode() not in answer
        server.stop()
        written = server.log_text()
    assert "GET /v1/agents/[REDACTED]" in written or '"path":"/v1/agents/[REDACTED]"' in written
    assert key not in written
    assert key[4:] not in written


def test_a_malformed_logging_call_passes_the_filter_to_be_reported_by_logging():
    """The filter never raises into the code that logged: a record whose message cannot be
    made is let through, for the handler to report as logging always does."""
    from api.observe import ScrubKeys

    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "two %s %s", ("one",), None)
    assert ScrubKeys().filter(record) is True
