"""Misbehaving stand-ins for the service on a real loopback socket: the client and the guard
are exercised through their real HTTP stack, never mocked. Each server is stopped (and its
thread joined) when the ``with`` block ends."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

#: how long the "slow" server holds a request at most (the test releases it sooner)
HOLD_SECONDS = 30


@contextmanager
def faulty_service(
    status: int = 200,
    body: bytes = b"",
    *,
    headers: dict[str, str] | None = None,
    hold: bool = False,
    trickle: bool = False,
) -> Iterator[tuple[str, list[bytes]]]:
    """Yields (base URL, request bodies received). Every POST is answered ``status`` with
    ``body``; with ``hold``, only after the test ends (so any client time-out fires first);
    with ``trickle``, the body a byte every 50 ms (each read arrives well within any per-read
    time-out, the whole body never within a call's deadline)."""
    released = threading.Event()
    received: list[bytes] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            received.append(self.rfile.read(length))
            if hold:
                released.wait(HOLD_SECONDS)
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                if not trickle:
                    self.wfile.write(body)
                for byte in body if trickle else b"":
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    if released.wait(0.05):  # pacing the fault; the test's end stops it
                        return
            except OSError:
                pass  # the client gave up (time-out): nothing to answer

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        released.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=HOLD_SECONDS)
