"""A pytest plugin that fails the run if an API key leaks anywhere the suite can see.

Over the whole run it reads, as they happen:

- every response body of every in-process Flask app (JSON, errors, CSV exports, streamed or
  not), whatever test made the request;
- every log record of the test process (``agentauth.*`` at INFO and up, everything else at
  WARNING and up), with its exception text;
- the logs of every real server the tests start (:mod:`tests.server`), exceptions included;

and at the end every text column of the run's shared database (audit entries, policies,
agents, keys, sync status).

A leak is a full key (``svc_`` + 32 hex characters, issued or not: echoing a caller's guess is a
leak too) or the 32 hex characters of a key the run issued. The one place a key may appear is
the answer to its own creation (``POST /v1/api-keys``, 201), which is read only to learn the key.
Leaks are listed at the end of the run, without the key, and turn the exit status into a failure.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import create_engine, inspect, select

FULL_KEY = re.compile(r"svc_[0-9a-fA-F]{32}")
HEX_RUN = re.compile(r"[0-9a-fA-F]{32,}")  # a key's hex may sit anywhere in a longer run
_HEX = 32
_TAIL = 40  # a key split across two chunks is found in the tail of one plus the next


@dataclass
class Scanner:
    issued: set[str] = field(default_factory=set)  # the 32 hex characters of issued keys
    leaks: list[str] = field(default_factory=list)
    scanned: dict[str, int] = field(default_factory=dict)  # texts read, by source
    current_test: str = "(no test)"

    def issue(self, key: str) -> None:
        self.issued.add(key.removeprefix("svc_").lower())

    def scan(self, text: str, where: str) -> None:
        self.scanned[where] = self.scanned.get(where, 0) + 1
        found = {m.group() for m in FULL_KEY.finditer(text)}
        bare = FULL_KEY.sub(" ", text)  # the hex of a full key found is not a second leak
        found |= {hit for run in HEX_RUN.findall(bare) for hit in self._issued_in(run)}
        for hit in sorted(found):
            at = text.find(hit)
            context = (
                text[max(0, at - 60) : at] + "<KEY>" + text[at + len(hit) : at + len(hit) + 40]
            )
            self.leaks.append(f"{where} during {self.current_test}: ...{context!r}...")

    def _issued_in(self, run: str) -> set[str]:
        """Every issued key's hex in a run of hex characters, at any offset: each 32-character
        window of the run is looked up (a run is rarely longer than a SHA-256 digest)."""
        if not self.issued:
            return set()
        lowered = run.lower()
        return {
            run[at : at + _HEX]
            for at in range(len(run) - _HEX + 1)
            if lowered[at : at + _HEX] in self.issued
        }


SCANNER = Scanner()


# ------------------------------------------------------------------------------ response bodies


def _is_key_creation(environ: dict[str, Any], status: str) -> bool:
    return (
        environ.get("REQUEST_METHOD") == "POST"
        and environ.get("PATH_INFO", "").rstrip("/") == "/v1/api-keys"
        and status.startswith("201")
    )


class _ScannedBody:
    """Passes a WSGI body through unchanged, reading each chunk on its way."""

    def __init__(self, body: Iterable[bytes], where: str, creation: bool) -> None:
        self._body = body
        self._where = where
        self._creation = creation
        self._seen = bytearray()

    def __iter__(self) -> Iterator[bytes]:
        tail = b""
        for chunk in self._body:
            if self._creation:
                self._seen += chunk
            else:
                SCANNER.scan((tail + chunk).decode("utf-8", "replace"), self._where)
                tail = (tail + chunk)[-_TAIL:]
            yield chunk
        if self._creation:  # learnt here: not every client closes the body it has read
            for key in FULL_KEY.findall(self._seen.decode("utf-8", "replace")):
                SCANNER.issue(key)

    def close(self) -> None:
        close: Callable[[], None] | None = getattr(self._body, "close", None)
        if close is not None:
            close()


def _install_body_scan() -> Callable[[], None]:
    original = Flask.__call__

    def scanned_call(self: Flask, environ: dict[str, Any], start_response: Any) -> Any:
        status_seen: list[str] = []

        def recording_start(status: str, headers: Any, exc_info: Any = None) -> Any:
            status_seen.append(status)
            for name, value in headers:
                SCANNER.scan(f"{name}: {value}", "response header")
            return start_response(status, headers, exc_info)

        body = original(self, environ, recording_start)
        creation = bool(status_seen) and _is_key_creation(environ, status_seen[0])
        return _ScannedBody(body, "response body", creation)

    Flask.__call__ = scanned_call  # type: ignore[method-assign]

    def undo() -> None:
        Flask.__call__ = original  # type: ignore[method-assign]

    return undo


# ------------------------------------------------------------------------------------- logs


class _LogScan(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "_secrets_scanned", False):  # seen by both handlers it passed
            return
        record._secrets_scanned = True
        try:
            text = record.getMessage()
        except Exception:  # a record that cannot format is the emitter's bug, not a leak
            text = str(record.msg)
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        SCANNER.scan(f"{text}\n{record.exc_text or ''}", f"log record ({record.name})")


_HANDLER = _LogScan(logging.INFO)


def _install_log_scan() -> Callable[[], None]:
    root = logging.getLogger()
    service = logging.getLogger("agentauth")
    root.addHandler(_HANDLER)
    access = logging.getLogger("agentauth.access")  # serve stops it propagating
    access.addHandler(_HANDLER)
    before = service.level
    service.setLevel(logging.INFO)

    def undo() -> None:
        root.removeHandler(_HANDLER)
        access.removeHandler(_HANDLER)
        service.setLevel(before)

    return undo


def scan_server_log(text: str) -> None:
    """Called by :mod:`tests.server` with a real server's whole log before it is removed."""
    SCANNER.scan(text, "server log")


def note_issued_key(key: str) -> None:
    """Called for keys minted by the fixtures, so their bare hex is looked for too."""
    SCANNER.issue(key)


def scan_database(url: str) -> None:
    """Every row of every table of the run's database (JSON columns included), at the end."""
    from core.store.models import Base

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            present = set(inspect(conn).get_table_names())
            for table in Base.metadata.sorted_tables:
                if table.name in present:
                    for row in conn.execute(select(table)).yield_per(2000):
                        text = "\n".join(str(v) for v in row if v is not None)
                        SCANNER.scan(text, f"database table {table.name}")
    finally:
        engine.dispose()


# ------------------------------------------------------------------------------------ hooks


_UNDO: list[Callable[[], None]] = []


def pytest_configure(config: pytest.Config) -> None:
    _UNDO.append(_install_body_scan())
    _UNDO.append(_install_log_scan())


def pytest_runtest_setup(item: pytest.Item) -> None:
    SCANNER.current_test = item.nodeid


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    for undo in reversed(_UNDO):
        undo()
    _UNDO.clear()
    if SCANNER.leaks and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any) -> None:
    read = sum(SCANNER.scanned.values())
    if SCANNER.leaks:
        terminalreporter.section("API keys leaked", sep="=", red=True, bold=True)
        for leak in SCANNER.leaks[:50]:
            terminalreporter.line(leak)
        if len(SCANNER.leaks) > 50:
            terminalreporter.line(f"... and {len(SCANNER.leaks) - 50} more")
    else:
        terminalreporter.line(
            f"secrets scan: no API key in {read} texts "
            f"({len(SCANNER.issued)} issued keys looked for)"
        )
