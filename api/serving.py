"""The front between the HTTP server and the app: a request reaches a thread of the app only
once it is whole.

``agentauth serve`` runs granian (a Rust HTTP server) with its RSGI interface: each request
arrives on the worker's event loop, where :class:`Front` reads its body with a deadline and a
size limit, and only then runs the Flask app (a WSGI app) on one of a few threads; except
``/v1/authorize``, whose endpoint answers on the event loop itself and waits there, without a
thread, for the recorder's thread to decide and commit (``api.authorize``): a hop to a thread
and back for each call cost more CPU than the decision (bench/RESULTS.md, #21). A client
that sends its headers or body slowly, or never finishes them, holds a socket and a coroutine,
never a thread: granian closes a connection whose headers do not arrive within the header
deadline, and the front answers 408 to a body that does not arrive within the body deadline,
without calling the app, so the request changes nothing. A request that announces a body
without an API key of the right shape is refused (by the app's authentication, 401) before a
byte of its body is read. Why this stack: bench/RESULTS.md, "Issue 22, finding 2".

An answer is sent once whole, so that one failing part-way is a 500 rather than a cut answer
that looks complete; except one the app marks as streamed (an export of the whole audit log),
which is sent as it is produced, through a pipe, and aborted if it fails (``api.streaming``).

The front also answers, in the service's JSON error shape, what the app never sees: a request
target longer than :data:`MAX_TARGET_BYTES` (414) and headers over :data:`MAX_HEADER_BYTES`
(431). Granian answers, itself and with an empty body, a request it cannot parse (400), one of
more than 100 header fields or of headers past its buffer of 400 KiB (431).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

from flask import Flask

from api import streaming
from api.authorize import Routes
from api.errors import error_body, render_error
from api.metrics import IN_FLIGHT
from api.observe import COUNTED, HEADER, NOSNIFF, log_access, request_id
from core.store.keys import presented_key

#: the longest request target (path and query) and the most header bytes a request may send
MAX_TARGET_BYTES = 8 * 1024
MAX_HEADER_BYTES = 64 * 1024
#: an answer longer than this (an export) is spooled to a file and sent from there
SPOOL_BYTES = 1024 * 1024
#: how long the front keeps its own handle on a spooled answer after handing it to granian,
#: which opens the file again (by its /proc path) as it starts to send it
SPOOL_HOLD_SECONDS = 60
#: where a process finds its open files by number (Linux): how granian is given a file that
#: has no name, so nothing is ever left on disk, even by a killed worker
_OWN_FILES = "/proc/self/fd"

#: the request target and headers refused before the app: status, code, message
_TARGET_TOO_LONG = (
    414,
    "URI_TOO_LONG",
    f"the request target is longer than {MAX_TARGET_BYTES:,} bytes",
)
_HEADERS_TOO_LARGE = (
    431,
    "HEADERS_TOO_LARGE",
    f"the request headers are larger than {MAX_HEADER_BYTES:,} bytes",
)
_CODING = (
    400,
    "VALIDATION_ERROR",
    "Transfer-Encoding must be chunked (no other coding is decoded)",
)
_CLOSE = ("Connection", "close")

_PROTOCOLS = {"1": "HTTP/1.0", "1.0": "HTTP/1.0", "1.1": "HTTP/1.1", "2": "HTTP/2"}

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class Front:
    """The RSGI app of a granian worker: reads each request whole, then runs ``app`` on a
    thread of a pool of ``threads``."""

    def __init__(self, app: Flask, threads: int, body_seconds: float, max_body: int) -> None:
        self.app = app
        self.wsgi: WSGIApp = app.wsgi_app
        #: the app's routes to what it answers on the event loop (api.authorize)
        self.routes = app.wsgi_app if isinstance(app.wsgi_app, Routes) else None
        self.max_body = max_body
        self.body_seconds = body_seconds
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="agentauth")
        self.on_close: list[Callable[[], None]] = []

    def __rsgi_init__(self, loop: asyncio.AbstractEventLoop) -> None:
        pass

    def __rsgi_del__(self, loop: asyncio.AbstractEventLoop) -> None:
        """The worker is stopping, its requests answered: the threads, then whatever else the
        worker holds (its database connections, its metrics files)."""
        self.pool.shutdown(wait=True)
        for close in self.on_close:
            close()

    async def __rsgi__(self, scope: Any, protocol: Any) -> None:
        if scope.proto != "http":  # a WebSocket: this service has none
            return
        IN_FLIGHT.inc()  # from its headers on (api.observe.COUNTED)
        try:
            await self._serve(scope, protocol)
        finally:
            IN_FLIGHT.dec()

    async def _serve(self, scope: Any, protocol: Any) -> None:
        started = time.perf_counter()
        headers = scope.headers
        refusal = _refused_before_reading(scope, headers)
        if refusal is not None:
            self._answer_error(protocol, scope, headers, started, *refusal)
            return
        # what the app is told of the body: its length, once it is here whole
        length = headers.get("content-length")
        close = False
        if length is None and "transfer-encoding" not in headers:
            body, told = b"", None
        elif length == "0":
            body, told = b"", "0"
        elif presented_key(headers.get("authorization")) is None:
            # not read: the app refuses the request (401) as it does any without a key; the
            # connection is closed after the answer, with the unread body on it
            body, told, close = b"", "0", True
        elif length is not None and length.isdigit() and int(length) > self.max_body:
            # not read: the app answers 413 for the length announced, once the key is checked
            body, told, close = b"", length, True
        else:
            try:
                async with asyncio.timeout(self.body_seconds):
                    body = await _read(protocol, self.max_body)
            except TimeoutError:
                self._answer_error(
                    protocol, scope, headers, started, 408, "REQUEST_TIMEOUT",
                    f"the request body did not arrive within {self.body_seconds:g} seconds",
                )  # fmt: skip
                return
            except Exception:  # the client went away, or sent a malformed chunk
                self._answer_error(
                    protocol, scope, headers, started, 400, "VALIDATION_ERROR",
                    "the request body could not be read",
                )  # fmt: skip
                return
            if length is not None and len(body) < int(length):  # the client half-closed
                self._answer_error(
                    protocol, scope, headers, started, 400, "VALIDATION_ERROR",
                    f"the request body is shorter than its Content-Length ({length} bytes)",
                )  # fmt: skip
                return
            # a body past the limit is handed on cut one byte past it, of no announced length:
            # the app answers 413 (api.params.Request)
            told = str(len(body)) if len(body) <= self.max_body else None
            close = told is None
        environ = _environ(scope, headers, body, told)
        here = self.routes.asynchronous(environ) if self.routes is not None else None
        if here is not None:  # answered on the event loop: it waits for the database's thread
            status, out_headers, data = await here(environ)
            if close:
                out_headers.append(_CLOSE)
            protocol.response_bytes(status, _without_length(out_headers), data)
            return
        # the whole request on one thread (the app's context vars stay on it), the answer
        # whole when it returns: in memory, or spooled to a file when it is long; or sent
        # from that thread as it is produced, when the app marks it so (api.streaming)
        loop = asyncio.get_running_loop()

        def stream(status: int, out_headers: list[tuple[str, str]]) -> streaming.Channel:
            channel = streaming.Channel()
            if close:
                out_headers.append(_CLOSE)
            loop.call_soon_threadsafe(protocol.response_file, status, out_headers, channel.path)
            return channel

        answer = await loop.run_in_executor(self.pool, _run, self.wsgi, environ, stream)
        if answer is _SENT:
            return
        if answer is None:  # the app failed part-way through a long answer (logged)
            self._answer_error(
                protocol, scope, headers, started, 500, "INTERNAL_ERROR", "unexpected server error"
            )
            return
        assert isinstance(answer, tuple)
        status, out_headers, data, spooled = answer
        if close:
            out_headers.append(_CLOSE)
        if spooled is None:
            protocol.response_bytes(status, out_headers, data)
            return
        # granian reads the file as the client takes it, so a slow reader holds no memory; it
        # opens the file itself, a moment later, so this handle stays open a while
        protocol.response_file(status, out_headers, f"{_OWN_FILES}/{spooled.fileno()}")
        asyncio.get_running_loop().call_later(SPOOL_HOLD_SECONDS, spooled.close)

    def _answer_error(
        self, protocol: Any, scope: Any, headers: Any, started: float, status: int, code: str,
        message: str,
    ) -> None:  # fmt: skip
        """An answer of the front's own, in the service's error shape; the connection closes."""
        data = json.dumps(error_body(code, message), separators=(",", ":")).encode()
        rid = request_id(headers.get(HEADER.lower()) or "")
        protocol.response_bytes(
            status,
            [("Content-Type", "application/json"), (HEADER, rid), NOSNIFF, _CLOSE],
            data,
        )
        log_access(rid, scope.method, scope.path, status, started, None)


def _refused_before_reading(scope: Any, headers: Any) -> tuple[int, str, str] | None:
    if len(scope.path) + len(scope.query_string) > MAX_TARGET_BYTES:
        return _TARGET_TOO_LONG
    if sum(len(k) + len(v) for k, v in headers.items()) > MAX_HEADER_BYTES:
        return _HEADERS_TOO_LARGE
    coding = headers.get("transfer-encoding")
    if coding is not None and coding.strip().lower() != "chunked":
        # the server frames the body by its last coding (chunked) but decodes no other: a body
        # labelled gzip would reach the app still compressed, or pass for what it is not
        return _CODING
    return None


async def _read(protocol: Any, limit: int) -> bytes:
    """The whole body, or (when it runs past ``limit``) its first ``limit + 1`` bytes: the app
    then answers 413, as it does for a body announced too long."""
    parts: list[bytes] = []
    size = 0
    async for part in protocol:
        parts.append(part)
        size += len(part)
        if size > limit:
            break
    return b"".join(parts)[: limit + 1]


def _environ(scope: Any, headers: Any, body: bytes, length: str | None) -> dict[str, Any]:
    """The WSGI environ of a request whose body is ``body``, of ``length`` (PEP 3333; None: a
    body of no announced length, read until ``body`` ends)."""
    server_host, _, server_port = scope.server.rpartition(":")
    client_host, _, client_port = scope.client.rpartition(":")
    client_host = client_host.removeprefix("[").removesuffix("]")  # an IPv6 address, bare
    environ: dict[str, Any] = {
        "REQUEST_METHOD": scope.method,
        "SCRIPT_NAME": "",
        # WSGI's "bytes as latin-1" string of the path as sent, percent-decoded
        "PATH_INFO": scope.path.encode("utf-8", "surrogateescape").decode("latin-1"),
        "QUERY_STRING": scope.query_string,
        "SERVER_NAME": server_host,
        "SERVER_PORT": server_port,
        "REMOTE_ADDR": client_host,
        "REMOTE_PORT": client_port,
        "SERVER_PROTOCOL": _PROTOCOLS.get(scope.http_version, "HTTP/1.1"),
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": scope.scheme,
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
        "wsgi.input_terminated": True,
        COUNTED: True,
    }
    for name, value in headers.items():
        if name == "content-length":
            continue
        if name == "content-type":
            environ["CONTENT_TYPE"] = value
            continue
        if name == "transfer-encoding":
            continue  # the body is here, whole: it has a length now
        if "_" in name:
            # dropped, as gunicorn and Werkzeug do: X_Forwarded_For would pass for
            # X-Forwarded-For once both are HTTP_X_FORWARDED_FOR
            continue
        key = "HTTP_" + name.upper().replace("-", "_")
        if key in environ:  # a field sent twice: one value, as RFC 9110 joins them
            environ[key] += ("; " if key == "HTTP_COOKIE" else ", ") + value
        else:
            environ[key] = value
    if length is not None:
        environ["CONTENT_LENGTH"] = length
    return environ


class _Started:
    __slots__ = ("headers", "status")

    def __init__(self) -> None:
        self.status = 500
        self.headers: list[tuple[str, str]] = []

    def __call__(
        self, status: str, headers: list[tuple[str, str]], exc_info: Any = None
    ) -> Callable[[bytes], None]:
        self.status = int(status[:3])
        self.headers = headers
        return _no_write


def _no_write(_data: bytes) -> None:
    raise RuntimeError("write() is not supported: return the body")


#: what :func:`_run` returns for an answer it has sent itself, as it was produced
_SENT = object()

#: what :func:`_run` is given to send an answer as it is produced: called on the thread with
#: the status and headers, it starts the answer and returns the channel to write the body to
Stream = Callable[[int, list[tuple[str, str]]], streaming.Channel]


def _run(
    app: WSGIApp, environ: dict[str, Any], stream: Stream | None = None
) -> tuple[int, list[tuple[str, str]], bytes, IO[bytes] | None] | object | None:
    """On a thread: run the app and take its whole answer. Returns the status, the headers,
    and the body: in memory when it is at most :data:`SPOOL_BYTES` (or where there is no
    /proc), else in a file of no name, returned open. Such an answer is never sent before it
    is whole, so one that fails part-way is a 500, not a cut answer that looks complete; None
    then, the error logged. An answer the app marks as streamed (api.streaming: an export) is
    sent with ``stream`` as it is produced instead, and aborted if it fails part-way;
    :data:`_SENT` then."""
    started = _Started()
    if stream is not None:
        environ[streaming.STREAMS] = True
    result = app(environ, started)
    if stream is not None and streaming.is_marked(started.headers):
        headers = streaming.unmarked(_without_length(started.headers))
        if environ["REQUEST_METHOD"] == "HEAD":  # no body to send, none to produce
            _close(result)
            return started.status, headers, b"", None
        try:
            streaming.pump(result, stream(started.status, headers))
        finally:
            _close(result)
        return _SENT
    spool: IO[bytes] | None = None
    parts: list[bytes] = []
    try:
        size = 0
        for chunk in result:
            if spool is not None:
                spool.write(chunk)
                continue
            parts.append(chunk)
            size += len(chunk)
            if size > SPOOL_BYTES and os.path.isdir(_OWN_FILES):
                # a file with no name (O_TMPFILE, or unlinked at once): gone once closed
                spool = tempfile.TemporaryFile(prefix="agentauth-answer-")  # noqa: SIM115
                spool.writelines(parts)
                parts = []
    except Exception as exc:
        if spool is not None:
            spool.close()
        render_error(exc)  # logged as an unexpected error, with its traceback
        return None
    finally:
        _close(result)
    headers = _without_length(started.headers)
    if spool is None:
        if environ["REQUEST_METHOD"] == "HEAD":  # the length a GET would have
            headers = started.headers
        return started.status, headers, b"".join(parts), None
    spool.flush()
    headers.append(("Content-Length", str(spool.tell())))
    return started.status, headers, b"", spool


def _without_length(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The server sets the length of a whole answer itself."""
    return [(k, v) for k, v in headers if k.lower() != "content-length"]


def _close(result: Any) -> None:
    close = getattr(result, "close", None)
    if close is not None:
        close()
