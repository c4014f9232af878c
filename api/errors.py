"""The one table from error types to HTTP statuses, and the handlers that render every error,
ours or Werkzeug's, as ``{"error": {"code", "message", "details"?}}``. Nothing leaks a traceback,
and no error body holds an API key of this service: messages name what the caller sent (a field,
a duplicate member, a query parameter, a value), so :func:`error_body` scrubs every body, whatever
made it."""

from __future__ import annotations

import logging
from typing import Any

from flask import Flask, Response, current_app, jsonify
from werkzeug.exceptions import HTTPException

from api.metrics import RATE_LIMITED
from core.domain import errors
from core.domain.redaction import scrub_json

log = logging.getLogger("agentauth.api")

STATUS: dict[type[errors.AgentAuthError], int] = {
    errors.ValidationError: 400,
    errors.AuthError: 401,
    errors.InsufficientScope: 403,
    errors.SelfApprovalForbidden: 403,
    errors.NotFound: 404,
    errors.ApprovalNotPending: 409,
    errors.MethodNotAllowed: 405,
    errors.PayloadTooLarge: 413,
    errors.RateLimited: 429,
    errors.ConfigError: 500,
    errors.StorageError: 500,
}

#: Werkzeug's own errors (routing, body size) in our vocabulary
HTTP_CODES = {
    400: "VALIDATION_ERROR",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    413: "PAYLOAD_TOO_LARGE",
    415: "VALIDATION_ERROR",
}


def status_of(error: errors.AgentAuthError) -> int:
    for kind in type(error).__mro__:
        if kind in STATUS:
            return STATUS[kind]
    return 500


def error_response(status: int, code: str, message: str, **extra: Any) -> Response:
    response = jsonify(error_body(code, message, **extra))
    response.status_code = status
    return response


def error_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    """Every error body is made here: a key the caller sent as a name or a value is masked."""
    return {"error": scrub_json({"code": code, "message": message, **extra})}


def render_error(error: Exception) -> tuple[int, dict[str, Any], dict[str, str]]:
    """Status, body and extra headers for an error raised while serving a request, with what
    an operator sees of it (log line, metrics): the one rendering of errors, for Flask's
    handlers here and for ``POST /v1/authorize`` (:class:`api.authorize.Endpoint`)."""
    if not isinstance(error, errors.AgentAuthError):
        log.error("unexpected error", exc_info=error)
        return 500, error_body("INTERNAL_ERROR", "unexpected server error"), {}
    extra: dict[str, Any] = {}
    if isinstance(error, errors.ValidationError) and error.problems:
        extra["details"] = [{"field": p.path, "message": p.message} for p in error.problems]
    headers: dict[str, str] = {}
    if isinstance(error, errors.RateLimited):
        headers["Retry-After"] = str(error.retry_after)
        RATE_LIMITED.labels("key").inc()
    if isinstance(error, errors.StorageError):
        log.error("storage error: %s", error.message, exc_info=error.__cause__)
    return status_of(error), error_body(error.code, error.message, **extra), headers


def handle_error(error: Exception) -> Response:
    status, body, headers = render_error(error)
    response = jsonify(body)
    response.status_code = status
    response.headers.update(headers)
    return response


def handle_http_error(error: HTTPException) -> Response:
    status, body, headers = render_http_error(error, int(current_app.config["MAX_CONTENT_LENGTH"]))
    response = jsonify(body)
    response.status_code = status
    response.headers.update(headers)
    return response


def render_http_error(
    error: HTTPException, max_body: int
) -> tuple[int, dict[str, Any], dict[str, str]]:
    """Status, body and extra headers (``Allow`` of a 405) for one of Werkzeug's errors: a
    routing miss, a body too large or cut short."""
    status = error.code or 500
    code = HTTP_CODES.get(status, "INTERNAL_ERROR" if status >= 500 else "BAD_REQUEST")
    messages = {
        404: "no such endpoint",
        405: "method not allowed for this endpoint",
        413: f"the request body is larger than the limit of {_size(max_body)}",
    }
    body = error_body(code, messages.get(status, error.description or code))
    headers = {k: v for k, v in error.get_headers() if status == 405 and k.lower() == "allow"}
    return status, body, headers


def _size(limit: int) -> str:
    """The body limit in words: ``1 MiB (1,048,576 bytes)``."""
    mib, rest = divmod(limit, 1024 * 1024)
    return f"{mib} MiB ({limit:,} bytes)" if mib and not rest else f"{limit:,} bytes"


def register(app: Flask) -> None:
    app.register_error_handler(HTTPException, handle_http_error)
    app.register_error_handler(Exception, handle_error)  # ours (AgentAuthError) and any other
