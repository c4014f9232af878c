"""The HTTP clients of ``POST /v1/authorize`` and ``GET /v1/approvals/<id>``:
:class:`AuthzClient` (blocking) and :class:`AsyncAuthzClient` (asyncio), both on httpx with real
time-outs. They share everything but the sending: the request is built by :func:`_request_body`
(or :func:`_approval_path`), and every answer goes through :mod:`agentauth.answers`, which
returns a :class:`Decision` (or an :class:`Approval`) or raises one of :mod:`agentauth.errors`.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import anyio
import httpx

from agentauth.answers import (
    APPROVAL_ID,
    MAX_ANSWER_BYTES,
    Approval,
    Decision,
    read_answer,
    read_approval,
)
from agentauth.errors import ServiceUnavailableError
from agentauth.params import to_json

#: seconds for connecting, sending and reading each; an authorization check sits in front of
#: every tool call, so a stuck service must not hang the agent for long
DEFAULT_TIMEOUT = 5.0
AUTHORIZE_PATH = "/v1/authorize"
APPROVALS_PATH = "/v1/approvals/"
#: a session id the service takes (decisions §8): 1 to 255 printable ASCII characters
SESSION_ID = re.compile(r"[\x20-\x7e]{1,255}")
_KEY = re.compile(r"[\x21-\x7e]+")  # printable ASCII without spaces: what a header can carry


def _client_options(
    base_url: str, api_key: str, timeout: float | httpx.Timeout, trust_env: bool
) -> dict[str, Any]:
    """What both clients give their httpx client (checked here, once)."""
    return {
        "base_url": _base_url(base_url),
        "headers": _headers(api_key),
        "timeout": timeout,
        "follow_redirects": False,
        "trust_env": trust_env,
    }


class _Answer:
    """The body of an answer as it arrives, read up to the size cap and the call's deadline."""

    def __init__(self, deadline: float) -> None:
        self.content = bytearray()
        self.whole = True
        self._started, self._deadline = time.monotonic(), deadline

    def add(self, chunk: bytes) -> bool:
        """Take a chunk; False when reading must stop (the answer is then not ``whole``)."""
        self.content += chunk
        late = time.monotonic() - self._started > self._deadline
        self.whole = len(self.content) <= MAX_ANSWER_BYTES and not late
        return self.whole


@dataclass(frozen=True)
class _Received:
    """An answer as received: its status and headers, the body read (up to the cap), and
    whether that body is all of it."""

    status: int
    headers: httpx.Headers
    content: bytes
    whole: bool


class AuthzClient:
    """A blocking client: ``AuthzClient(base_url, api_key).authorize(agent, tool, params)``.

    One connection pool per client: create it once and share it (it is thread-safe); close it
    with :meth:`close` or a ``with`` block. ``timeout`` is seconds per phase (connect, write,
    read, pool) or an ``httpx.Timeout``.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
        trust_env: bool = False,
    ) -> None:
        options = _client_options(base_url, api_key, timeout, trust_env)
        self.base_url: str = options["base_url"]
        self._deadline = _deadline(timeout)
        self._http = httpx.Client(transport=transport, **options)

    def authorize(
        self,
        agent_id: str,
        tool_name: str,
        parameters: Mapping[str, Any] | None = None,
        *,
        session_id: str | None = None,
    ) -> Decision:
        """May ``agent_id`` call ``tool_name`` with ``parameters``? A denial (or an escalation:
        ``outcome == "escalated"``) is a Decision, not an error; errors are raised as
        :mod:`agentauth.errors` says. ``session_id``: the conversation or run the call belongs
        to (1 to 255 printable ASCII characters; ValueError before any request otherwise), for
        per-session rate limits and budgets and the audit log."""
        body = _request_body(agent_id, tool_name, parameters, session_id)
        got = self._exchange("POST", AUTHORIZE_PATH, body)
        return read_answer(got.status, got.headers, got.content, got.whole)

    def approval(self, approval_id: str) -> Approval:
        """The approval ``approval_id`` as the service has it now (any key of the workspace may
        read it): ``approval(decision.approval_id).status``. An unknown id raises
        :class:`BadRequestError` (``APPROVAL_NOT_FOUND``, 404); other errors as for
        :meth:`authorize`. An id that cannot be one raises ValueError before any request."""
        got = self._exchange("GET", _approval_path(approval_id), None)
        return read_approval(got.status, got.headers, got.content, got.whole, approval_id)

    def _exchange(self, method: str, path: str, body: bytes | None) -> _Received:
        answer = _Answer(self._deadline)
        failure: ServiceUnavailableError | None = None
        try:
            with self._http.stream(method, path, content=body) as response:
                for chunk in response.iter_bytes():
                    if not answer.add(chunk):
                        break
        except httpx.HTTPError as exc:
            failure = _unreachable(exc, self.base_url)
        if failure is not None:  # raised outside the except: no httpx error (nor key) behind it
            raise failure
        return _Received(
            response.status_code, response.headers, bytes(answer.content), answer.whole
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> AuthzClient:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:  # never the key
        return f"AuthzClient(base_url={self.base_url!r})"


class AsyncAuthzClient:
    """The asyncio twin of :class:`AuthzClient`: ``await client.authorize(...)``; close with
    :meth:`aclose` or ``async with``."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        transport: httpx.AsyncBaseTransport | None = None,
        trust_env: bool = False,
    ) -> None:
        options = _client_options(base_url, api_key, timeout, trust_env)
        self.base_url: str = options["base_url"]
        self._deadline = _deadline(timeout)
        self._http = httpx.AsyncClient(transport=transport, **options)

    async def authorize(
        self,
        agent_id: str,
        tool_name: str,
        parameters: Mapping[str, Any] | None = None,
        *,
        session_id: str | None = None,
    ) -> Decision:
        """See :meth:`AuthzClient.authorize`."""
        body = _request_body(agent_id, tool_name, parameters, session_id)
        got = await self._exchange("POST", AUTHORIZE_PATH, body)
        return read_answer(got.status, got.headers, got.content, got.whole)

    async def approval(self, approval_id: str) -> Approval:
        """See :meth:`AuthzClient.approval`."""
        got = await self._exchange("GET", _approval_path(approval_id), None)
        return read_approval(got.status, got.headers, got.content, got.whole, approval_id)

    async def _exchange(self, method: str, path: str, body: bytes | None) -> _Received:
        answer = _Answer(self._deadline)
        failure: ServiceUnavailableError | None = None
        received: httpx.Response | None = None
        try:
            with anyio.fail_after(None if math.isinf(self._deadline) else self._deadline):
                async with self._http.stream(method, path, content=body) as response:
                    received = response
                    async for chunk in response.aiter_bytes():
                        if not answer.add(chunk):
                            break
        except httpx.HTTPError as exc:
            failure = _unreachable(exc, self.base_url)
        except TimeoutError:
            if received is None:  # not even the status within the deadline
                failure = ServiceUnavailableError(
                    f"no answer from {self.base_url} within {self._deadline:g} s",
                    code="UNAVAILABLE",
                )
            else:  # the status came, the body did not: as the blocking client, a cut answer
                answer.whole = False
        if failure is not None:  # raised outside the except: no httpx error (nor key) behind it
            raise failure
        assert received is not None  # without a failure, the answer's status came
        return _Received(
            received.status_code, received.headers, bytes(answer.content), answer.whole
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncAuthzClient:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"AsyncAuthzClient(base_url={self.base_url!r})"


# ------------------------------------------------------------------------ shared by both


def _base_url(base_url: str) -> str:
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        raise ValueError("base_url must be an http:// or https:// URL")
    return base_url.rstrip("/")


def _deadline(timeout: float | httpx.Timeout) -> float:
    """Seconds a whole call may take: each phase (connect, write, read) has ``timeout``, and a
    server that keeps trickling bytes is cut off once connect plus read time is spent (the
    async client bounds the whole call so; the blocking one bounds reading the body)."""
    if isinstance(timeout, httpx.Timeout):
        phases = [t for t in (timeout.connect, timeout.read) if t is not None]
        return sum(phases) if len(phases) == 2 else math.inf
    return 2 * float(timeout)


def _headers(api_key: str) -> dict[str, str]:
    # the key itself is never echoed, here or anywhere else
    if not isinstance(api_key, str) or not _KEY.fullmatch(api_key):
        raise ValueError("api_key must be a non-empty string of printable ASCII without spaces")
    return {
        "Authorization": f"Bearer {api_key}",
        "Content-Type": "application/json",
        "Accept": "application/json",
        "User-Agent": "agentauth-python",
    }


def check_session_id(session_id: str | None) -> str | None:
    """``session_id`` when it is None or a session id the service takes (1 to 255 printable
    ASCII characters), else ValueError (TypeError for what is not a string)."""
    if session_id is None:
        return None
    if not isinstance(session_id, str):
        raise TypeError("session_id must be a string")
    if not SESSION_ID.fullmatch(session_id):
        raise ValueError("session_id must be 1 to 255 printable ASCII characters")
    return session_id


def _request_body(
    agent_id: str,
    tool_name: str,
    parameters: Mapping[str, Any] | None,
    session_id: str | None = None,
) -> bytes:
    if not isinstance(agent_id, str):
        raise TypeError("agent_id must be a string (the agent's id)")
    if not isinstance(tool_name, str):
        raise TypeError("tool_name must be a string")
    if parameters is None:
        parameters = {}
    if not isinstance(parameters, Mapping):
        raise TypeError("parameters must be a mapping of parameter names to values")
    payload: dict[str, Any] = {
        "agent_id": agent_id,
        "tool_name": tool_name,
        "parameters": to_json(parameters),
    }
    if check_session_id(session_id) is not None:
        payload["session_id"] = session_id
    try:
        return json.dumps(payload, allow_nan=False, separators=(",", ":")).encode()
    except (ValueError, RecursionError) as exc:  # an int past Python's digit limit, ...
        raise TypeError(f"parameters cannot be written as JSON: {exc}") from None


def _approval_path(approval_id: str) -> str:
    """The approval's URL path; the id is checked first, so it is one path segment as is."""
    if not isinstance(approval_id, str):
        raise TypeError("approval_id must be a string (the approval's id)")
    if not APPROVAL_ID.fullmatch(approval_id):
        raise ValueError("approval_id must be an approval's id: letters, digits, '-' and '_'")
    return APPROVALS_PATH + approval_id


def _unreachable(exc: httpx.HTTPError, base_url: str) -> ServiceUnavailableError:
    if isinstance(exc, httpx.TimeoutException):
        message = f"no answer from {base_url} in time ({type(exc).__name__})"
    else:
        message = f"cannot reach {base_url} ({type(exc).__name__})"
    return ServiceUnavailableError(message, code="UNAVAILABLE")
