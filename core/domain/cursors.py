"""The audit list's cursors (decisions §9): where a walk stands, sealed so that a client can
neither read more into it than the API said nor change it unnoticed.

A cursor holds the newest ``seq`` the walk serves (what was committed when it started) and the
``(timestamp, id)`` of the last entry served; it is bound to the workspace and to the filters
it was made for by an HMAC-SHA-256 over all of them, keyed by a secret derived from the
service's audit signing key (every server of one database shares that key, so a cursor made by
one is read by all). Pure: the API passes the secret in.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from dataclasses import dataclass
from datetime import datetime, timedelta

from core.domain.auditcounts import EPOCH

MAX_LENGTH = 512
_VERSION = 1
_TAG_BYTES = 16


@dataclass(frozen=True)
class Position:
    """The last entry a page served, and the newest seq of the walk."""

    seq_max: int
    timestamp: datetime
    id: str


class CursorError(ValueError):
    """A cursor that is malformed, altered, or made for other filters or another workspace."""


def secret_of(signing_key_bytes: bytes) -> bytes:
    """The cursors' HMAC key, derived from the audit signing key's raw bytes."""
    return hashlib.sha256(b"agentauth audit cursor\n" + signing_key_bytes).digest()


def seal(position: Position, workspace_id: str, filters: str, secret: bytes) -> str:
    """``position`` as an opaque string; ``filters`` is the canonical text of the walk's
    filters."""
    micros = (position.timestamp - EPOCH) // timedelta(microseconds=1)
    payload = json.dumps([_VERSION, position.seq_max, micros, position.id], separators=(",", ":"))
    body = _b64(payload.encode())
    return f"{body}.{_b64(_tag(body, workspace_id, filters, secret))}"


def open_cursor(text: str, workspace_id: str, filters: str, secret: bytes) -> Position:
    """The position ``text`` holds, or CursorError."""
    if not isinstance(text, str) or not 1 <= len(text) <= MAX_LENGTH or text.count(".") != 1:
        raise CursorError("is not a cursor this API gave")
    body, tag = text.split(".")
    try:
        given = _unb64(tag)
        _unb64(body)
    except (binascii.Error, ValueError):
        raise CursorError("is not a cursor this API gave") from None
    if not hmac.compare_digest(given, _tag(body, workspace_id, filters, secret)):
        raise CursorError("was altered, or made for other filters or another workspace")
    try:
        version, seq_max, micros, id_ = json.loads(_unb64(body))
        if version != _VERSION or type(seq_max) is not int or type(micros) is not int:
            raise ValueError
        if type(id_) is not str:
            raise ValueError
        return Position(seq_max, EPOCH + timedelta(microseconds=micros), id_)
    except (ValueError, TypeError, OverflowError, binascii.Error):
        raise CursorError("is not a cursor this API gave") from None


def _tag(body: str, workspace_id: str, filters: str, secret: bytes) -> bytes:
    message = "\n".join((str(_VERSION), workspace_id, filters, body)).encode()
    return hmac.new(secret, message, hashlib.sha256).digest()[:_TAG_BYTES]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    """Base64url without padding, in its one canonical spelling: a last character that
    differs only in bits the bytes do not use is another cursor, refused."""
    if not text or any(c not in _ALPHABET for c in text):
        raise ValueError("not base64url")
    data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if _b64(data) != text:
        raise ValueError("not canonical base64url")
    return data


_ALPHABET = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
