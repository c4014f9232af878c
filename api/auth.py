"""Authentication, scopes and per-key rate limiting, as request hooks.

Every view is protected unless marked :func:`public`; :func:`requires` marks the admin-only
ones. Order: key (401) -> per-key rate limit (429) -> scope (403) -> query names (400). The key
is looked up without the write lock; the per-key count is one atomic upsert, exact across
processes, in a short write transaction of its own or, for views marked
:func:`counts_in_its_transaction`, inside the view's transaction.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from flask import Flask, Response, current_app, g, request
from werkzeug.datastructures import MultiDict

from api.context import close_reader, now, principal, reader, services
from core.domain.errors import InsufficientScope, RateLimited, StorageError, ValidationError
from core.store import keys
from core.store.database import Database
from core.store.keys import Scope
from core.store.limits import CounterStore, SqlCounters

F = TypeVar("F", bound=Callable[..., Any])
WINDOW_SECONDS = 60
log = logging.getLogger("agentauth.api")


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
    so ``?dry_run=1`` on a DELETE can never be silently ignored. So is a value holding a NUL
    character, which no stored text can (PostgreSQL refuses it outright)."""

    def mark(view: F) -> F:
        view._agentauth_query = frozenset(names)  # type: ignore[attr-defined]
        return view

    return mark


def check_query() -> None:
    view = _view()
    if request.routing_exception is not None or view is None:
        return
    refuse_query(request.args, getattr(view, "_agentauth_query", frozenset()))


def refuse_query(args: MultiDict[str, str], accepted: frozenset[str]) -> None:
    """ValidationError for a query parameter not in ``accepted``, one given twice, or a value
    holding NUL (see :func:`takes_query`)."""
    for name in args:
        if name not in accepted:
            raise ValidationError.field(name, "unknown query parameter")
        values = args.getlist(name)
        if len(values) > 1:
            raise ValidationError.field(name, "must be given at most once")
        if "\x00" in values[0]:
            raise ValidationError.field(name, "must not contain NUL characters")


def _view() -> Any:
    return current_app.view_functions.get(request.endpoint or "")


def counts_in_its_transaction(view: F) -> F:
    """The view takes the caller's per-key slot inside its own write transaction (through
    :func:`take_key_slot`), saving the hot path a second commit. If the view fails before
    that, the slot is taken after the response is built, so failures still count."""
    view._agentauth_deferred_slot = True  # type: ignore[attr-defined]
    return view


@dataclass
class KeySlot:
    """This request's place in its key's one-minute window. Taken once, possibly on the
    decision recorder's thread (no Flask context there: only this object is touched)."""

    key_id: str
    window_start: int
    limit: int
    moment: datetime
    taken: bool = False
    count: int | None = None

    def take(self, counters: CounterStore) -> None:
        """Count the request in the caller's transaction; RateLimited when the window is full.
        The window is the one the request was counted in (or refused by): its own, or a later
        one another request opened first, which the headers then name."""
        name = f"key:{self.key_id}"
        counted = counters.consume(name, self.window_start, self.limit)
        self.taken = True
        if counted is None:
            found = counters.stored(name)
            if found is not None and found.window_start > self.window_start:
                self.window_start = found.window_start
        else:
            self.count, self.window_start = counted
        if self.count is None:
            end = self.window_start + WINDOW_SECONDS
            retry = max(1, math.ceil(end - self.moment.timestamp()))
            raise RateLimited(
                retry, f"more than {self.limit} requests this minute; retry in {retry} s"
            )

    def headers(self) -> dict[str, str]:
        return {
            "X-RateLimit-Limit": str(self.limit),
            "X-RateLimit-Remaining": str(0 if self.count is None else self.limit - self.count),
            "X-RateLimit-Reset": str(self.window_start + WINDOW_SECONDS),
        }


def authenticate_request() -> None:
    if request.routing_exception is not None:  # unknown route or method: 404/405 as such
        return
    view = _view()
    if view is None or getattr(view, "_agentauth_public", False):
        return
    svc = services()
    moment = now()
    caller = keys.authenticate(reader(), request.headers.get("Authorization"), moment)
    reader().close()  # no connection is held while the client sends its body (taken again on use)
    g.principal = caller
    g.key_slot = slot_for(caller, moment, svc.settings.rate_limit_per_minute)
    if not getattr(view, "_agentauth_deferred_slot", False):
        with svc.db.connect(write=True) as connection:
            g.key_slot.take(SqlCounters(connection))
    require_scope(caller, getattr(view, "_agentauth_scope", Scope.READ_ONLY))


def require_scope(caller: keys.Principal, needed: Scope) -> None:
    if not caller.can(needed):
        raise InsufficientScope(f"this operation needs an API key with the {needed} scope")


def key_slot() -> KeySlot:
    """This request's slot, for a view marked :func:`counts_in_its_transaction` to take: in the
    window of the request's instant, which its body's arrival may have moved on."""
    slot: KeySlot = g.key_slot
    if not slot.taken:
        slot = g.key_slot = slot_for(principal(), now(), slot.limit)
    return slot


def slot_for(caller: keys.Principal, moment: datetime, limit: int) -> KeySlot:
    """The caller's place in the one-minute window holding ``moment``, not yet taken."""
    window = int(moment.timestamp()) // WINDOW_SECONDS * WINDOW_SECONDS
    return KeySlot(caller.key_id, window, limit, moment)


def add_rate_headers(response: Response) -> Response:
    slot: KeySlot | None = g.get("key_slot")
    if slot is not None:
        response.headers.update(settle_slot(slot, response.status_code, services().db))
    return response


def settle_slot(slot: KeySlot, status: int, db: Database) -> dict[str, str]:
    """Once the answer's status is known: count a request whose view failed before taking its
    slot, and give the rate-limit headers (also used by ``api.authorize.Endpoint``)."""
    if not slot.taken and status >= 500:
        # the service failed this request: it is not charged to the key, and an unavailable
        # database is not waited for a second time just to count it
        return {}
    if not slot.taken:  # a deferred slot the view never reached (it failed first) still counts
        try:
            with db.connect(write=True) as connection:
                slot.take(SqlCounters(connection))
        except RateLimited:
            pass  # the request already failed on its own; its count is what mattered
        except StorageError:
            log.warning("could not count a failed request against its key's rate limit")
    return slot.headers() if slot.taken else {}


def register(app: Flask) -> None:
    app.before_request(authenticate_request)
    app.before_request(check_query)
    app.after_request(add_rate_headers)
    app.teardown_request(close_reader)
