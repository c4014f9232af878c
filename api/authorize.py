"""``POST /v1/authorize``: may this agent call this tool with these parameters? 200 for allowed
and denied alike; the audit entry is committed before the answer leaves.

One implementation, :class:`Endpoint`, answers every request for this path, refusals included,
and Flask has no route for it: :class:`Routes` (the app's WSGI entry, set by ``create_app``)
sends the path here and everything else to Flask. Why not a Flask view: Flask's per-request
machinery (request and app contexts, routing, the five hooks with their ``LocalProxy`` lookups,
a response object) cost more CPU than the decision itself, and this path is the service's hot
path (bench/RESULTS.md, "Issue 21": a third more CPU a call). What those hooks do for a request
the endpoint does by calling the same functions, in the same order: the request id and access
line (``api.observe``), the key, scope, query and per-key slot (``api.auth``), the body
(``api.params``, on Flask's own ``Request`` class) and the rendering of errors
(``api.errors``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from flask import Flask, Response
from werkzeug.exceptions import HTTPException, MethodNotAllowed
from werkzeug.http import HTTP_STATUS_CODES

from api import metrics
from api.auth import KeySlot, refuse_query, require_scope, slot_for
from api.context import Services
from api.errors import render_error, render_http_error
from api.observe import COUNTED, HEADER, NOSNIFF, log_access, request_id
from api.params import Request, body_bytes, parse_body
from core.domain.errors import RateLimited, StorageError
from core.hotpath.decisions import Outcome
from core.hotpath.decisions import authorize as decide
from core.hotpath.reads import Reads
from core.hotpath.recorder import Batch
from core.store import keys
from core.store.keys import Principal, Scope

PATH = "/v1/authorize"
REQUEST_SCHEMA = "authorize.json#/$defs/request"
#: what the path answers to; any other method is 405 (OPTIONS as Flask answers it for a route)
METHODS = ("OPTIONS", "POST")
#: a body at most this long is parsed on the recorder's thread, once its key was found (at
#: most a few milliseconds, even for the slowest JSON); a longer one by its caller, on a thread
#: of its own, before a second trip to the recorder
PARSED_ON_THE_RECORDER = 16 * 1024
log = logging.getLogger("agentauth.api")

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
#: status, headers and body
Answer = tuple[int, list[tuple[str, str]], bytes]


class Routes:
    """The app's WSGI entry: any method on exactly ``/v1/authorize`` to :class:`Endpoint`, every
    other path to Flask (``inner``, Flask's ``wsgi_app``), which answers ``/v1/authorize/`` or
    ``//v1/authorize`` with its 404 as for any path it does not know. The server's front
    (``api.serving``) asks :meth:`asynchronous` for the same rule."""

    def __init__(self, inner: WSGIApp, endpoint: Endpoint) -> None:
        self.inner = inner
        self.endpoint = endpoint

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if environ.get("PATH_INFO") == PATH:
            return self.endpoint(environ, start_response)
        return self.inner(environ, start_response)

    def asynchronous(
        self, environ: dict[str, Any]
    ) -> Callable[[dict[str, Any]], Awaitable[Answer]] | None:
        """The coroutine that answers this request on the event loop, when there is one."""
        return self.endpoint.answer if environ.get("PATH_INFO") == PATH else None


@dataclass(slots=True, eq=False)
class _Call:
    """One request to the endpoint, from its arrival to its answer."""

    environ: dict[str, Any]
    received: float
    method: str
    counted: bool  # in flight, by the endpoint (not by the server's front)
    header: str | None = None
    moment: datetime | None = None
    #: refused before the key is looked up (405, a key of no key's shape): answered as it is
    error: Exception | None = None
    #: refused after the key: answered once the key is found, and counted against it
    refusal: Exception | None = None
    raw: bytes | None = None  # the body, until it is parsed (once its key was found)
    body: dict[str, Any] | None = None
    caller: Principal | None = None
    slot: KeySlot | None = None
    outcome: Outcome | None = None


class Endpoint:
    """``/v1/authorize``, whole. In order, as Flask's hooks and a view would: 405 for another
    method; the key (401), looked up once the body is complete (a key revoked while a client
    held its body back is refused); the query (400: the path takes none); OPTIONS answered; the
    Content-Type (400), the body (413, 400) and its schema (400); then the decision, committed
    with its audit entry and the key's slot (429 when the key's minute is full). Every answer
    carries the request id and ``nosniff``, every answer past the key the rate-limit headers,
    and every request writes one access line.

    What needs the database (the key, the agent, the decision, the key's slot, the audit
    entry) runs on the recorder's thread (``core.hotpath.recorder``), in its read phase and
    then its batch; the rest runs where the request is: a thread of a WSGI server
    (:meth:`__call__`, which waits for the recorder) or the front's event loop (:meth:`answer`,
    which awaits it)."""

    def __init__(self, app: Flask) -> None:
        self.app = app
        self.services: Services = app.extensions["agentauth"]
        self.max_body: int = app.config["MAX_CONTENT_LENGTH"]
        #: calls arrived and not yet answered, in this process: the recorder's batches wait for
        #: the ones on their way (core.hotpath.recorder.Recorder._gather)
        self._in_hand = 0
        self._in_hand_lock = threading.Lock()
        self.services.recorder.calls_in_progress = self._calls_in_hand

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        call = self._arrive(environ)
        recorder = self.services.recorder
        try:
            if call.error is None:
                try:
                    call.outcome = recorder.run(read=functools.partial(self._read, call))
                    if call.raw is not None:  # a long body: parsed now that its key was found
                        self._parse(call)
                        call.outcome = recorder.run(read=functools.partial(self._read, call))
                except Exception as exc:
                    self._failed(call, exc)
            status, headers, data = self._answer(call)
        finally:
            self._leave(call)
        start_response(f"{status} {HTTP_STATUS_CODES[status].upper()}", headers)
        return [data]

    async def answer(self, environ: dict[str, Any]) -> Answer:
        """The answer on an event loop, which serves other requests while this one waits for
        its batch (and a long body is parsed on a thread, not on the loop)."""
        call = self._arrive(environ)
        recorder = self.services.recorder
        try:
            if call.error is None:
                try:
                    call.outcome = await recorder.arun(read=functools.partial(self._read, call))
                    if call.raw is not None:
                        await asyncio.get_running_loop().run_in_executor(None, self._parse, call)
                        call.outcome = await recorder.arun(read=functools.partial(self._read, call))
                except Exception as exc:
                    self._failed(call, exc)
            return self._answer(call)
        finally:  # answered, failed, or cancelled: no longer in hand, nor in flight
            self._leave(call)

    def _arrive(self, environ: dict[str, Any]) -> _Call:
        """What can be known of the request without the database, and without parsing its body
        (a request whose key is not found never gets that far)."""
        method = environ.get("REQUEST_METHOD", "")
        call = _Call(environ, time.perf_counter(), method, not environ.get(COUNTED))
        with self._in_hand_lock:
            self._in_hand += 1
        if call.counted:  # from here until answered, unless the server's front counts it
            metrics.IN_FLIGHT.inc()
        try:
            request = Request(environ)
            request.max_content_length = self.max_body
            if method not in METHODS:
                raise MethodNotAllowed(valid_methods=METHODS)
            call.header = request.headers.get("Authorization")
            keys.required_key(call.header)
        except Exception as exc:
            call.error = exc
            return call
        try:
            refuse_query(request.args, frozenset())
            if method == "POST":
                call.raw = body_bytes(request)
        except Exception as exc:
            call.refusal = exc
        # the request's instant: its body is complete
        call.moment = self.services.clock()
        return call

    def _read(self, call: _Call, reads: Reads) -> Callable[[Batch], Outcome | None] | None:
        """On the recorder's thread, before the batch: the key, then the body (when it is short)
        and the decision, or for a call refused after the key only its count against the key.
        None for a long body, which its caller parses before it asks again."""
        svc = self.services
        assert call.moment is not None
        caller = call.caller = keys.authenticate(reads, call.header, call.moment)
        slot = call.slot = slot_for(caller, call.moment, svc.settings.rate_limit_per_minute)
        require_scope(caller, Scope.READ_ONLY)
        if call.raw is not None:
            if len(call.raw) > PARSED_ON_THE_RECORDER:
                return None
            self._parse(call)
        if call.body is None:  # refused, or OPTIONS: counted, as a request to any endpoint is
            return functools.partial(_count, slot)
        return decide(
            svc.db, svc.recorder.statements, svc.policies, caller, call.body, call.moment,
            call.received, reads=reads, on_transaction=slot.take,
        )  # fmt: skip

    def _calls_in_hand(self) -> int:
        return self._in_hand

    @staticmethod
    def _parse(call: _Call) -> None:
        assert call.raw is not None
        try:
            call.body = parse_body(call.raw, REQUEST_SCHEMA)
        except Exception as exc:
            call.refusal = exc
        call.raw = None

    @staticmethod
    def _failed(call: _Call, exc: Exception) -> None:
        """What the recorder raised. A call refused for what it is stays refused when only its
        count against its key could not be written (logged), as for any endpoint."""
        if call.refusal is not None and call.caller is not None and isinstance(exc, StorageError):
            log.warning("could not count a refused request against its key's rate limit")
            return
        call.error = exc

    def _answer(self, call: _Call) -> Answer:
        """Status, headers and body; the metrics and the access line."""
        status, answer, extra = self._status(call)
        if call.slot is not None and call.slot.taken:
            extra.update(call.slot.headers())
        data = b""
        headers: list[tuple[str, str]] = []
        if answer is not None:  # Flask's JSON provider makes the body, as of a view's
            encoded = cast(Response, self.app.json.response(answer))
            data = encoded.get_data()
            headers.append(("Content-Type", encoded.content_type or "application/json"))
        headers.append(("Content-Length", str(len(data))))
        headers.extend(extra.items())
        rid = request_id(call.environ.get("HTTP_X_REQUEST_ID", ""))
        headers += [(HEADER, rid), NOSNIFF]
        log_access(rid, call.method, PATH, status, call.received, call.caller)
        return status, headers, data

    def _leave(self, call: _Call) -> None:
        with self._in_hand_lock:
            self._in_hand -= 1
        if call.counted:
            metrics.IN_FLIGHT.dec()

    def _status(self, call: _Call) -> tuple[int, dict[str, Any] | None, dict[str, str]]:
        failed = call.error or call.refusal
        if isinstance(failed, HTTPException):  # Werkzeug's: 405, 413, a body cut short
            return render_http_error(failed, self.max_body)
        if failed is not None:
            if isinstance(failed, StorageError) and call.body is not None:
                metrics.AUDIT_FAILURES.inc()  # a decision was to be recorded
            return render_error(failed)
        if call.outcome is None:  # OPTIONS
            return 200, None, {"Allow": ", ".join(METHODS)}
        decision = call.outcome.decision
        metrics.DECISIONS.labels(decision.outcome).inc()
        metrics.LATENCY.observe(call.outcome.latency_ms / 1000)
        if decision.retry_after_seconds is not None:
            metrics.RATE_LIMITED.labels("rule").inc()
        would_be = call.outcome.would_be
        if would_be is not None:
            metrics.WOULD_BE.labels(would_be.policy_id or "", would_be.result).inc()
        return 200, call.outcome.as_response(), {}


def _count(slot: KeySlot, batch: Batch) -> None:
    """A request refused after its key was found still counts against the key; when the key's
    minute is already full it is answered for what it is, not 429."""
    with contextlib.suppress(RateLimited):
        slot.take(batch)
