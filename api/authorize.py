"""``POST /v1/authorize``: may this agent call this tool with these parameters? 200 for allowed
and denied alike; the audit entry is committed before the answer leaves.

One implementation, :class:`Endpoint`, answers every request for this path, refusals included,
and Flask has no route for it: :class:`Routes` (the app's WSGI entry, set by ``create_app``)
sends the path here and everything else to Flask. Why not a Flask view: Flask's per-request
machinery (request and app contexts, routing, the five hooks with their ``LocalProxy`` lookups,
a response object) cost more CPU than the decision itself, and this path is the service's hot
path (bench/RESULTS.md, "Why the code is shaped this way"). What those hooks do for a request
the endpoint does by calling the same functions, in the same order: the request id and access
line (``api.observe``), the key, scope, query and per-key slot (``api.auth``), the body
(``api.params``, on Flask's own ``Request`` class) and the rendering of errors
(``api.errors``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, cast

from flask import Flask, Response
from werkzeug.exceptions import HTTPException, MethodNotAllowed
from werkzeug.http import HTTP_STATUS_CODES

from api import metrics
from api.auth import KeySlot, refuse_query, require_scope, settle_slot, slot_for
from api.context import Services
from api.errors import render_error, render_http_error
from api.observe import BODY_READ, COUNTED, HEADER, NOSNIFF, log_access, request_id
from api.params import Request, body_bytes, parse_body
from core.domain.errors import StorageError
from core.hotpath.decisions import Outcome
from core.hotpath.decisions import authorize as decide
from core.hotpath.reads import Reads
from core.store import keys
from core.store.keys import Principal, Scope

PATH = "/v1/authorize"
REQUEST_SCHEMA = "authorize.json#/$defs/request"
#: what the path answers to; any other method is 405 (OPTIONS as Flask answers it for a route)
METHODS = ("OPTIONS", "POST")

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
#: status, headers, body and the caller (once known, for the access line)
Answer = tuple[int, list[tuple[str, str]], bytes, Principal | None]


class Routes:
    """The app's WSGI entry: ``POST /v1/authorize`` (any method on that exact path) to
    :class:`Endpoint`, every other path to Flask (``inner``, Flask's ``wsgi_app``), which answers
    ``/v1/authorize/`` or ``//v1/authorize`` with its 404 as for any path it does not know."""

    def __init__(self, inner: WSGIApp, endpoint: WSGIApp) -> None:
        self.inner = inner
        self.endpoint = endpoint

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if environ.get("PATH_INFO") == PATH:
            return self.endpoint(environ, start_response)
        return self.inner(environ, start_response)


class Endpoint:
    """``/v1/authorize``, whole. In order, as Flask's hooks and a view would: 405 for another
    method; the key (401), at the moment the body is complete (a key revoked while a client held
    its body back is refused); the query (400: the path takes none); OPTIONS answered; the
    Content-Type (400), the body (413, 400) and its schema (400); then the decision, committed
    with its audit entry and the key's slot (429 when the key's minute is full). Every answer
    carries the request id and ``nosniff``, every answer past the key the rate-limit headers,
    and every request writes one access line."""

    def __init__(self, app: Flask) -> None:
        self.app = app
        self.services: Services = app.extensions["agentauth"]
        self.max_body: int = app.config["MAX_CONTENT_LENGTH"]

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        received = time.perf_counter()
        counts = not environ.get(COUNTED)
        if counts:  # from here until answered, unless the server's front counts it
            metrics.IN_FLIGHT.inc()
        try:
            status, headers, data, caller = self._answer(environ, received)
        finally:
            if counts:
                metrics.IN_FLIGHT.dec()
        rid = request_id(environ.get("HTTP_X_REQUEST_ID", ""))
        headers += [(HEADER, rid), NOSNIFF]
        log_access(rid, environ.get("REQUEST_METHOD", ""), PATH, status, received, caller)
        start_response(f"{status} {HTTP_STATUS_CODES[status].upper()}", headers)
        return [data]

    def _answer(self, environ: dict[str, Any], received: float) -> Answer:
        svc = self.services
        request = Request(environ)
        request.max_content_length = self.max_body
        reads = Reads(svc.db.engine)
        caller: Principal | None = None
        slot: KeySlot | None = None
        answer: dict[str, Any] | None
        try:
            try:
                if request.method not in METHODS:
                    raise MethodNotAllowed(valid_methods=METHODS)
                header = request.headers.get("Authorization")
                moment = svc.clock()
                caller = keys.authenticate(reads, header, moment)  # before the body is read
                reads.close()  # no connection is held while the client sends its body
                slot = slot_for(caller, moment, svc.settings.rate_limit_per_minute)
                require_scope(caller, Scope.READ_ONLY)
                refuse_query(request.args, frozenset())
                if request.method == "OPTIONS":
                    status, answer, extra = 200, None, {"Allow": ", ".join(METHODS)}
                else:
                    raw = body_bytes(request)
                    if not environ.get(BODY_READ):
                        # the client may have held its body back: the request's instant is
                        # now, and its key is looked up again at it
                        moment = svc.clock()
                        caller = keys.authenticate(reads, header, moment)
                        slot = slot_for(caller, moment, svc.settings.rate_limit_per_minute)
                    body = parse_body(raw, REQUEST_SCHEMA)
                    outcome = decide_and_count(svc, caller, body, moment, received, reads, slot)
                    status, answer, extra = 200, outcome.as_response(), {}
            except HTTPException as exc:  # Werkzeug's: 405, 413, a body cut short
                status, answer, extra = render_http_error(exc, self.max_body)
            except Exception as exc:
                status, answer, extra = render_error(exc)
        finally:
            reads.close()
        return self._finish(slot, status, answer, extra, caller)

    def _finish(
        self, slot: KeySlot | None, status: int, answer: dict[str, Any] | None,
        extra: dict[str, str], caller: Principal | None,
    ) -> Answer:  # fmt: skip
        if slot is not None:
            extra.update(settle_slot(slot, status, self.services.db))
        data = b""
        headers: list[tuple[str, str]] = []
        if answer is not None:  # Flask's JSON provider makes the body, as it does of a view's
            encoded = cast(Response, self.app.json.response(answer))
            data = encoded.get_data()
            headers.append(("Content-Type", encoded.content_type or "application/json"))
        headers.append(("Content-Length", str(len(data))))
        headers.extend(extra.items())
        return status, headers, data, caller


def decide_and_count(
    svc: Services, caller: Principal, body: dict[str, Any], moment: datetime, received: float,
    reads: Reads, slot: KeySlot,
) -> Outcome:  # fmt: skip
    """The decision, committed with its audit entry and the caller's key slot; metrics."""
    try:
        outcome = decide(
            svc.db, svc.recorder, svc.policies, caller, body, moment, received, reads=reads,
            on_transaction=slot.take,
        )  # fmt: skip
    except StorageError:
        metrics.AUDIT_FAILURES.inc()
        raise
    metrics.DECISIONS.labels(outcome.decision.outcome).inc()
    metrics.LATENCY.observe(outcome.latency_ms / 1000)
    if outcome.decision.retry_after_seconds is not None:
        metrics.RATE_LIMITED.labels("rule").inc()
    return outcome
