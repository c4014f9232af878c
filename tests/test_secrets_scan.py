"""The run-wide key scan (tests/secrets_scan.py) itself: it must find what it looks for."""

from __future__ import annotations

import logging
import sys

import pytest

from tests import secrets_scan
from tests.secrets_scan import Scanner, _ScannedBody

KEY = "svc_" + "3f" * 16


@pytest.fixture
def scanner(monkeypatch: pytest.MonkeyPatch) -> Scanner:
    fresh = Scanner()
    monkeypatch.setattr(secrets_scan, "SCANNER", fresh)
    return fresh


def test_a_key_split_across_body_chunks_is_found(scanner):
    body = [b'{"detail": "' + KEY[:9].encode(), KEY[9:].encode() + b'"}']
    assert b"".join(_ScannedBody(body, "response body", creation=False)) == b"".join(body)
    assert len(scanner.leaks) == 1
    assert KEY not in scanner.leaks[0]  # the report never repeats the key


def test_a_created_key_is_learnt_and_its_bare_hex_found_later(scanner):
    created = [b'{"id": "k", "key": "' + KEY.encode() + b'"}']
    list(_ScannedBody(created, "response body", creation=True))
    assert scanner.leaks == []
    scanner.scan(f"token={KEY[4:]}", "log record")
    assert len(scanner.leaks) == 1


def test_log_records_with_exception_text_are_read(scanner):
    handler = secrets_scan._LogScan()
    try:
        raise ValueError(f"bad {KEY}")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, "f", 1, "failed", None, sys.exc_info())
    handler.emit(record)
    assert len(scanner.leaks) == 1


@pytest.mark.parametrize(
    "text",
    [
        f"token=a{KEY[4:]}",  # a hex character before it: the run starts one off the key
        f"digest={'0' * 17}{KEY[4:]}{'e' * 15}",  # inside a 64-character run, at an odd offset
        f"F{KEY[4:].upper()}",  # upper case, one off
    ],
    ids=["after-a-hex-character", "inside-a-longer-run", "upper-case"],
)
def test_an_issued_keys_bare_hex_is_found_at_any_offset_of_a_hex_run(scanner, text):
    scanner.issue(KEY)
    scanner.scan(text, "log record")
    assert len(scanner.leaks) == 1
    assert KEY[4:] not in scanner.leaks[0].lower()


def test_hex_runs_without_an_issued_key_are_not_leaks(scanner):
    scanner.issue(KEY)
    scanner.scan(f"sha256={'ab' * 32} uuid={'c' * 32} {KEY[4:-1]}", "log record")
    assert scanner.leaks == []
