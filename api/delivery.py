"""One try of a webhook delivery, and the address check it shares with webhook creation.

A try resolves the URL's host once, refuses it when any address it resolves to is not public
(loopback, private, link-local, ...; unless ``AGENTAUTH_WEBHOOK_ALLOW_PRIVATE`` allows them),
and then connects to those checked addresses themselves, never to the name: a second lookup
could answer differently (DNS rebinding). The URL's host still goes out as the ``Host`` header
and as the TLS server name, against which the certificate is verified. The request is the
event's JSON, signed; a 2xx answer delivers it, anything else (a redirect included: none is
followed) fails the try, which the worker retries. Proxy variables of the environment are
ignored (a proxy would resolve the name itself).

Called by ``api.outbox`` (the worker) for each try and by ``api.webhooks`` when a webhook is
created.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import socket
import ssl
import threading
import time
from datetime import datetime
from functools import cache
from typing import Any

import httpx

from core.domain.webhooks import TRY_TIMEOUT_SECONDS, Target, forbidden_reason, parse_url, sign
from core.store.webhooks import TryResult

USER_AGENT = "agentauth-webhooks/1"


class Unreachable(Exception):
    """The URL may not, or cannot, be reached: its message says why, for a person."""


def check_url(url: str, allow_private: bool) -> list[str]:
    """The addresses ``url``'s host resolves to, all of them allowed; Unreachable otherwise."""
    try:
        target = parse_url(url)
        httpx.URL(url)  # what each try will send it with must take it too
    except ValueError as exc:
        raise Unreachable(f"the URL {exc}") from None
    except httpx.InvalidURL:
        raise Unreachable("the URL is not valid") from None
    return resolve(target, allow_private)


def resolve(target: Target, allow_private: bool) -> list[str]:
    """One lookup of the target's host: its addresses, in the resolver's order. Unreachable
    when it has none, or when one of them is not public and that is not allowed (a name that
    resolves to a public and a private address is refused: either may be the one used)."""
    try:
        found = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        reason = str(exc.strerror if isinstance(exc, OSError) and exc.strerror else exc)
        raise Unreachable(f"the host {target.host} cannot be resolved ({reason})") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in found))
    if not addresses:
        raise Unreachable(f"the host {target.host} resolves to no address")
    if not allow_private:
        for address in addresses:
            kind = forbidden_reason(address)
            if kind is not None:
                what = (
                    f"{address} is"
                    if address == target.host
                    else f"the host {target.host} resolves to {address},"
                )
                raise Unreachable(
                    f"{what} a non-public ({kind}) address; "
                    "AGENTAUTH_WEBHOOK_ALLOW_PRIVATE=true allows such addresses"
                )
    return addresses


def event_body(payload: dict[str, Any]) -> bytes:
    """The request body: the event's ``{id, type, createdAt, data}`` as compact UTF-8 JSON."""
    ordered = {key: payload[key] for key in ("id", "type", "createdAt", "data")}
    return json.dumps(ordered, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def deliver(
    url: str, secret: str, event_id: str, body: bytes, now: datetime, allow_private: bool
) -> TryResult:
    """POST ``body`` to ``url``, signed at ``now``; what came of it. Never raises for anything
    the receiver, the network or DNS does: that is a failed try."""
    try:
        target = parse_url(url)
        host = httpx.URL(url).netloc.decode("ascii")
        addresses = resolve(target, allow_private)
    except ValueError as exc:
        return TryResult(False, error=f"the URL {exc}")
    except httpx.InvalidURL:
        return TryResult(False, error="the URL is not valid")
    except Unreachable as exc:
        return TryResult(False, error=str(exc))
    headers = {
        "Host": host,
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "X-Agentauth-Event-Id": event_id,
        "X-Agentauth-Signature": sign(secret, int(now.timestamp()), body),
    }
    deadline = _Deadline(TRY_TIMEOUT_SECONDS)
    try:
        result = TryResult(False, error="no address to connect to")
        for address in addresses:  # each was checked above; the next only if one refuses
            result, connected = _post(url, target, address, headers, body, deadline)
            if connected or deadline.expired:
                break
        return result
    finally:
        deadline.close()


def _post(
    url: str,
    target: Target,
    address: str,
    headers: dict[str, str],
    body: bytes,
    deadline: _Deadline,
) -> tuple[TryResult, bool]:
    """One request to ``address``: the result, and whether a connection was made."""
    pinned = httpx.URL(url).copy_with(host=address)
    left = deadline.remaining()
    extensions: dict[str, Any] = {
        "trace": deadline.trace,
        "timeout": {"connect": left, "read": left, "write": left, "pool": left},
    }
    if target.scheme == "https" and not _is_ip(target.host):
        extensions["sni_hostname"] = target.host
    request = httpx.Request("POST", pinned, headers=headers, content=body, extensions=extensions)
    try:
        with _client() as client:
            response = client.send(request, stream=True)
            response.close()  # the status is all we need: the body is never read
    except httpx.ConnectError as exc:
        if deadline.expired:
            return _timed_out(), False
        return TryResult(False, error=f"could not connect to {address}: {_words(exc)}"), False
    except httpx.TimeoutException:
        return _timed_out(), True
    except httpx.HTTPError as exc:
        if deadline.expired:
            return _timed_out(), True
        return TryResult(False, error=f"the request to {address} failed: {_words(exc)}"), True
    status = response.status_code
    if 200 <= status < 300:
        return TryResult(True, status), True
    if 300 <= status < 400:
        return TryResult(False, status, f"answered {status}: redirects are not followed"), True
    return TryResult(False, status, f"answered {status}"), True


def _timed_out() -> TryResult:
    return TryResult(False, error=f"no answer within {TRY_TIMEOUT_SECONDS:g} s")


def _words(exc: Exception) -> str:
    return " ".join(str(exc).split())[:500] or type(exc).__name__


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@cache
def _tls() -> ssl.SSLContext:
    """Certificates verified against the URL's host, with the CA bundle httpx trusts."""
    return httpx.create_ssl_context()


def _client() -> httpx.Client:
    return httpx.Client(
        timeout=httpx.Timeout(TRY_TIMEOUT_SECONDS),
        follow_redirects=False,
        trust_env=False,
        verify=_tls(),
    )


class _Deadline:
    """Cuts a try off once its time is up. httpx's time-outs bound each step (connecting,
    each read), not their sum, so a receiver that trickles its answer could hold a worker far
    longer; the sockets of the try, learnt from httpx's ``trace`` extension, are shut down when
    the time is up, which ends whatever step is under way."""

    def __init__(self, seconds: float) -> None:
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._end = time.monotonic() + seconds
        self.expired = False
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def remaining(self) -> float:
        """Seconds left, at least a little: each step's own time-out (httpx's), for the
        steps before there is a socket to shut down."""
        return max(self._end - time.monotonic(), 0.001)

    def trace(self, event: str, info: dict[str, Any]) -> None:
        if event != "connection.connect_tcp.complete":
            return
        stream = info.get("return_value")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if not isinstance(sock, socket.socket):
            return
        held = sock.dup()  # its own descriptor: TLS takes the first one over
        with self._lock:
            self._sockets.append(held)
            if self.expired:
                _shut(held)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._sockets:
                _shut(sock)

    def close(self) -> None:
        self._timer.cancel()
        with self._lock:
            for sock in self._sockets:
                sock.close()
            self._sockets.clear()


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed by the client
        sock.shutdown(socket.SHUT_RDWR)
