"""``POST /v1/authorize``: may this agent call this tool with these parameters? 200 for allowed
and denied alike; the audit entry is committed before the answer leaves.

Served twice over, with one behaviour: :class:`FastPath`, in front of Flask, answers a
well-formed call with the same pieces the hooks use (``api.observe``, ``api.auth``,
``api.errors``) but without Flask's per-request machinery, which cost more CPU than the decision
(bench/RESULTS.md, "Why the code is shaped this way"). Anything else, and any call refused before
the decision (401, 400, 413, ...), goes on to Flask and the :func:`authorize` view.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, cast

from flask import Blueprint, Flask, Response, g
from werkzeug.http import HTTP_STATUS_CODES

from api import metrics
from api.auth import KeySlot, counts_in_its_transaction, key_slot, settle_slot, slot_for
from api.context import Services, now, principal, reader, services
from api.errors import render_error
from api.observe import COUNTED, HEADER, NOSNIFF, RECEIVED, log_access, request_id
from api.params import parse_body, read_body
from core.domain.errors import StorageError
from core.hotpath.decisions import Outcome
from core.hotpath.decisions import authorize as decide
from core.hotpath.reads import Reads
from core.store import keys
from core.store.keys import Principal

bp = Blueprint("authorize", __name__)
PATH = "/v1/authorize"
REQUEST_SCHEMA = "authorize.json#/$defs/request"

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


@bp.post(PATH)
@counts_in_its_transaction
def authorize() -> dict[str, Any]:
    body = read_body(REQUEST_SCHEMA)
    svc, caller, slot = services(), principal(), key_slot()
    outcome = decide_and_count(svc, caller, body, now(), g.received, reader(), slot)
    return outcome.as_response()


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


class FastPath:
    """The WSGI app in front of Flask's: answers a well-formed authorize call itself and hands
    everything else to ``inner`` (Flask's ``wsgi_app``), with the body it read put back."""

    def __init__(self, app: Flask, inner: WSGIApp) -> None:
        self.inner = inner
        self.services: Services = app.extensions["agentauth"]
        self.max_body: int = app.config["MAX_CONTENT_LENGTH"]
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if not self._serves(environ):
            return self.inner(environ, start_response)
        received = time.perf_counter()
        counts = not environ.get(COUNTED)
        if counts:  # from here, as Flask's hook would, until answered or handed on
            metrics.IN_FLIGHT.inc()
        try:
            answer = self._answer(environ, received)
            if answer is not None:
                status, headers, data = answer
                start_response(f"{status} {HTTP_STATUS_CODES[status].upper()}", headers)
                return [data]
        finally:
            if counts:
                metrics.IN_FLIGHT.dec()
        # Flask's to answer, with the body given back in wsgi.input
        return self.inner(environ, start_response)

    def _answer(
        self, environ: dict[str, Any], received: float
    ) -> tuple[int, list[tuple[str, str]], bytes] | None:
        svc = self.services
        reads = Reads(svc.db.engine)
        caller: Principal | None = None
        slot: KeySlot | None = None
        raw: bytes | None = None
        try:
            try:
                header = environ.get("HTTP_AUTHORIZATION")
                if keys.presented_key(header) is None:  # refused (by Flask) before the body
                    return self._hand_on(environ, received, None)
                raw = self._body(environ)
                if raw is None:
                    return self._hand_on(environ, received, None)
                # the key looked up, and the call decided, at the moment the body was complete
                # (as api.context.body_arrived does): a key revoked or expired while the client
                # held its body back is refused; and no connection was held meanwhile
                moment = svc.clock()
                caller = keys.authenticate(reads, header, moment)
                body = parse_body(raw, REQUEST_SCHEMA)
            except StorageError as exc:  # answered here: Flask would wait for the database again
                status, answer, extra = render_error(exc)
            except Exception:  # refused before the decision: Flask answers, as for any request
                return self._hand_on(environ, received, raw)
            else:
                slot = slot_for(caller, moment, svc.settings.rate_limit_per_minute)
                try:
                    outcome = decide_and_count(svc, caller, body, moment, received, reads, slot)
                    status, answer, extra = 200, outcome.as_response(), dict[str, str]()
                except Exception as exc:
                    status, answer, extra = render_error(exc)
        finally:
            reads.close()
        if slot is not None:
            extra.update(settle_slot(slot, status, svc.db))
        # Flask's JSON provider makes the body, as it does of a view's dict
        encoded = cast(Response, self.app.json.response(answer))  # app.response_class
        data = encoded.get_data()
        rid = request_id(environ.get("HTTP_X_REQUEST_ID", ""))
        headers = [
            ("Content-Type", encoded.content_type or "application/json"),
            ("Content-Length", str(len(data))),
            *extra.items(),
            (HEADER, rid),
            NOSNIFF,
        ]
        log_access(rid, "POST", PATH, status, received, caller)
        return status, headers, data

    @staticmethod
    def _hand_on(environ: dict[str, Any], received: float, raw: bytes | None) -> None:
        """Leave the call to Flask: the body read so far back in ``wsgi.input``, and the
        moment of receipt for its access line's duration."""
        if raw is not None:
            environ["wsgi.input"] = io.BytesIO(raw)
        environ[RECEIVED] = received
        return None

    def _serves(self, environ: dict[str, Any]) -> bool:
        """Whether this is a call for this path: anything else is Flask's from the start."""
        if environ.get("PATH_INFO") != PATH or environ.get("REQUEST_METHOD") != "POST":
            return False
        if environ.get("QUERY_STRING"):
            return False
        content_type = environ.get("CONTENT_TYPE", "")
        if content_type.partition(";")[0].strip().lower() != "application/json":
            return False
        length = environ.get("CONTENT_LENGTH", "")
        return length.isascii() and length.isdigit() and int(length) <= self.max_body

    def _body(self, environ: dict[str, Any]) -> bytes | None:
        """The body, or None when the client sent less than it announced, or its stream failed
        (Flask, given what did arrive, answers 400 as it does for any request)."""
        size = int(environ["CONTENT_LENGTH"])
        stream, parts, got = environ["wsgi.input"], [], 0
        while got < size:  # a server's stream may hand the body over in several reads
            try:
                part = stream.read(size - got)
            except (OSError, ValueError):  # the client went away: Flask answers that too
                break
            if not part:
                break
            parts.append(part)
            got += len(part)
        raw = b"".join(parts)
        if len(raw) != size:
            environ["wsgi.input"] = io.BytesIO(raw)
            return None
        return raw
