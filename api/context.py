"""What a request handler reaches for: the app's settings, database and clock, and the caller."""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime

from flask import current_app, g
from sqlalchemy import Connection

from core.clock import Clock
from core.config import Settings
from core.db import Database
from core.decisions import PolicyCache
from core.keys import Principal


@dataclass(frozen=True)
class Services:
    settings: Settings
    db: Database
    clock: Clock
    policies: PolicyCache


def services() -> Services:
    found: Services = current_app.extensions["agentauth"]
    return found


def principal() -> Principal:
    """The authenticated caller (set by the auth hook before any protected view runs)."""
    found: Principal = g.principal
    return found


def reader() -> Connection:
    """One read connection per request, opened on first use and closed when the request ends
    (the key lookup and the decision's reads share it)."""
    if "reader" not in g:
        stack = ExitStack()
        g.reader = stack.enter_context(services().db.connect())
        g.reader_stack = stack
    connection: Connection = g.reader
    return connection


def close_reader(_error: BaseException | None = None) -> None:
    stack: ExitStack | None = g.pop("reader_stack", None)
    g.pop("reader", None)
    if stack is not None:
        stack.close()


def now() -> datetime:
    """One reading of the clock per request, so every timestamp of a request agrees."""
    if "now" not in g:
        g.now = services().clock()
    moment: datetime = g.now
    return moment
