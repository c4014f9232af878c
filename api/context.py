"""What a request handler reaches for: the app's settings, database and clock, and the caller."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flask import current_app, g, request

from core.config import Settings
from core.domain.clock import Clock
from core.hotpath.decisions import PolicyCache
from core.hotpath.reads import Reads
from core.hotpath.recorder import Recorder
from core.store import keys
from core.store.database import Database
from core.store.keys import Principal


@dataclass(frozen=True)
class Services:
    settings: Settings
    db: Database
    clock: Clock
    policies: PolicyCache
    recorder: Recorder
    #: the key that signs audit checkpoints, read (or created) on first use
    audit_key: Callable[[], Ed25519PrivateKey]

    def close(self) -> None:
        """Give back every connection of this process (the recorder's kept one first)."""
        self.recorder.close()
        self.db.dispose()


def services() -> Services:
    found: Services = current_app.extensions["agentauth"]
    return found


def principal() -> Principal:
    """The authenticated caller (set by the auth hook before any protected view runs)."""
    found: Principal = g.principal
    return found


def reader() -> Reads:
    """The request's hot-path reads (key, agent), on one pooled driver connection taken on
    first use and given back when the request ends."""
    reads: Reads | None = g.get("reads")
    if reads is None:
        reads = g.reads = Reads(services().db.engine)
    return reads


def close_reader(_error: BaseException | None = None) -> None:
    reads: Reads | None = g.pop("reads", None)
    if reads is not None:
        reads.close()


def now() -> datetime:
    """The request's instant: one reading of the clock, so every timestamp of a request agrees.
    Read when the request is authenticated, and again once its body has arrived
    (:func:`body_arrived`): what the request does happens then."""
    if "now" not in g:
        g.now = services().clock()
    moment: datetime = g.now
    return moment


def body_arrived() -> datetime:
    """The request's instant from now on: the moment its body was complete. A client may hold
    its body back for as long as the server lets it; what the request decides (a rate limit's
    window, a time window, an approval's expiry, its audit entry's timestamp) must be decided
    at this moment, not at the one its headers arrived. The caller's key is looked up again at
    it: one revoked or expired meanwhile is refused."""
    moment: datetime = services().clock()
    g.now = moment
    if g.get("principal") is not None:
        g.principal = keys.authenticate(reader(), request.headers.get("Authorization"), moment)
    return moment
