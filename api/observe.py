"""What operators see of each request: a request id and one JSON log line; and when the
request was received (``g.received``), from which its duration is measured.

Every response carries ``X-Request-Id``: the caller's own when it sent a sane one (1 to 128
characters of ``A-Z a-z 0-9 . _ : -``, and holding no API key), else a new one; the same id is
in the request's log line, so a client's report can be found in the logs. One line per request
on the ``agentauth.access`` logger, a JSON object: time, level, request id, method, path (any API
key in it masked; never the query string, nor any header), status, duration in ms, and the
caller's workspace and key id once authenticated (the key's id, never the key). ``agentauth
serve`` writes these lines to standard error (:func:`configure_logging`). Registered by
``create_app``.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
import uuid
from datetime import UTC, datetime

from flask import Flask, Response, g, request

from api.metrics import IN_FLIGHT
from core.domain.redaction import KEY_SHAPE, scrub
from core.store.keys import Principal

HEADER = "X-Request-Id"
NOSNIFF = ("X-Content-Type-Options", "nosniff")
#: a WSGI environ key: the server's front (api.serving) counts the request in flight from its
#: headers on, so the app does not count it again
COUNTED = "agentauth.counted"
_SANE = re.compile(r"[A-Za-z0-9._:-]{1,128}")
access = logging.getLogger("agentauth.access")


def request_id(offered: str) -> str:
    """The caller's ``X-Request-Id`` when it is sane and holds no key, else a new one."""
    sane = _SANE.fullmatch(offered) and not KEY_SHAPE.search(offered)  # a key is never echoed
    return offered if sane else uuid.uuid4().hex


def begin_request() -> None:
    g.request_id = request_id(request.headers.get(HEADER, ""))
    g.received = time.perf_counter()  # the log line's start
    if not request.environ.get(COUNTED):
        IN_FLIGHT.inc()
        g.in_flight = True


def end_request(_error: BaseException | None) -> None:
    if g.pop("in_flight", False):  # teardown runs even when an earlier hook raised
        IN_FLIGHT.dec()


def finish_request(response: Response) -> Response:
    rid: str = g.get("request_id") or uuid.uuid4().hex
    response.headers[HEADER] = rid
    # every answer says what it is: a browser must not read a JSON error as a page or a script
    response.headers.setdefault(*NOSNIFF)
    log_access(
        rid,
        request.method,
        request.path,
        response.status_code,
        g.get("received"),
        g.get("principal"),
    )
    return response


def log_access(
    request_id: str,
    method: str,
    path: str,
    status: int,
    started: float | None,
    caller: Principal | None,
) -> None:
    """The request's one line on the access logger (written for Flask's views by
    :func:`finish_request`, and by ``api.authorize.Endpoint``)."""
    if not access.isEnabledFor(logging.INFO):
        return
    record = {
        "ts": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "level": "error" if status >= 500 else "info",
        "request_id": request_id,
        "method": method,
        "path": scrub(path),  # a key sent as a path segment is not written to the log
        "status": status,
        "duration_ms": None if started is None else round((time.perf_counter() - started) * 1e3, 3),
        "workspace": caller.workspace_id if caller else None,
        "key_id": caller.key_id if caller else None,
    }
    line = json.dumps(record, separators=(",", ":"))
    access.log(logging.ERROR if status >= 500 else logging.INFO, line)


class ScrubKeys(logging.Filter):
    """Masks this service's API keys in a record's message and traceback: on every handler of
    the service's processes, so that no log line holds a key, whichever logger wrote it (the
    server's, Flask's, ours) and whatever it quoted (a path, an exception's message)."""

    _formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
            masked = scrub(message)
            if masked != message:
                record.msg, record.args = masked, None
            if record.exc_info and not record.exc_text:  # formatted here, as a formatter would
                record.exc_text = self._formatter.formatException(record.exc_info)
            if record.exc_text:
                record.exc_text = scrub(record.exc_text)
            if record.stack_info:
                record.stack_info = scrub(record.stack_info)
        except Exception:  # a malformed call: the handler reports it, as logging always does
            return True
        return True


_SCRUB = ScrubKeys()
#: the loggers whose handlers get the filter: the root (Flask's app logger and ours propagate
#: to it) and the HTTP server's
_LOGGERS = ("", "_granian", "granian.access", access.name)


def configure_logging() -> None:
    """Access lines, as they are, to standard error (each is already a JSON object); and the key
    filter on every handler there is, Python's last-resort one included."""
    if not any(getattr(h, "_agentauth", False) for h in access.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler._agentauth = True  # type: ignore[attr-defined]
        access.addHandler(handler)
        access.setLevel(logging.INFO)
        access.propagate = False
    every = [h for name in _LOGGERS for h in logging.getLogger(name).handlers]
    if logging.lastResort is not None:
        every.append(logging.lastResort)
    for each in every:
        if _SCRUB not in each.filters:
            each.addFilter(_SCRUB)


def register(app: Flask) -> None:
    app.before_request(begin_request)
    app.teardown_request(end_request)
    app.after_request(finish_request)  # registered first, so it runs last: sees the final status
