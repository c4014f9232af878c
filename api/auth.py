"""Authentication, scopes and per-key rate limiting, as request hooks.

Every view is protected unless marked :func:`public`; :func:`requires` marks the admin-only
ones. Order: key (401) -> per-key rate limit (429) -> scope (403). The key lookup and the
counter upsert share one short write transaction; the limit is exact across processes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, TypeVar

from flask import Flask, Response, current_app, g, request

from api.context import now, services
from core import keys, limits
from core.errors import InsufficientScope, RateLimited, ValidationError
from core.keys import Scope

F = TypeVar("F", bound=Callable[..., Any])
WINDOW_SECONDS = 60


def public(view: F) -> F:
    """No API key needed (health checks, the OpenAPI document)."""
    view._agentauth_public = True  # type: ignore[attr-defined]
    return view


def requires(scope: Scope) -> Callable[[F], F]:
    """The scope a view needs; views without this accept any valid key."""

    def mark(view: F) -> F:
        view._agentauth_scope = scope  # type: ignore[attr-defined]
        return view

    return mark


def takes_query(*names: str) -> Callable[[F], F]:
    """The query parameters a view reads; any other one is refused with 400 before it runs,
    so ``?dry_run=1`` on a DELETE can never be silently ignored."""

    def mark(view: F) -> F:
        view._agentauth_query = frozenset(names)  # type: ignore[attr-defined]
        return view

    return mark


def check_query() -> None:
    view = _view()
    if request.routing_exception is not None or view is None:
        return
    accepted: frozenset[str] = getattr(view, "_agentauth_query", frozenset())
    for name in request.args:
        if name not in accepted:
            raise ValidationError.field(name, "unknown query parameter")
        if len(request.args.getlist(name)) > 1:
            raise ValidationError.field(name, "must be given at most once")


def _view() -> Any:
    return current_app.view_functions.get(request.endpoint or "")


def authenticate_request() -> None:
    if request.routing_exception is not None:  # unknown route or method: 404/405 as such
        return
    view = _view()
    if view is None or getattr(view, "_agentauth_public", False):
        return
    svc = services()
    moment = now()
    window = int(moment.timestamp()) // WINDOW_SECONDS * WINDOW_SECONDS
    limit = svc.settings.rate_limit_per_minute
    with svc.db.transaction(write=True) as session:
        caller = keys.authenticate(session, request.headers.get("Authorization"), moment)
        count = limits.consume(session, f"key:{caller.key_id}", window, limit)
    g.principal = caller
    g.rate = (limit, 0 if count is None else limit - count, window + WINDOW_SECONDS)
    if count is None:
        retry = max(1, math.ceil(window + WINDOW_SECONDS - moment.timestamp()))
        raise RateLimited(retry, f"more than {limit} requests this minute; retry in {retry} s")
    needed = getattr(view, "_agentauth_scope", Scope.READ_ONLY)
    if not caller.can(needed):
        raise InsufficientScope(f"this operation needs an API key with the {needed} scope")


def add_rate_headers(response: Response) -> Response:
    if "rate" in g:
        limit, remaining, reset = g.rate
        response.headers["X-RateLimit-Limit"] = str(limit)
        response.headers["X-RateLimit-Remaining"] = str(remaining)
        response.headers["X-RateLimit-Reset"] = str(reset)
    return response


def mark_received() -> None:
    """When the request arrived: decision latency is measured from here."""
    g.received = time.perf_counter()


def register(app: Flask) -> None:
    app.before_request(mark_received)
    app.before_request(authenticate_request)
    app.before_request(check_query)
    app.after_request(add_rate_headers)
