"""API keys and workspaces: issue, authenticate, list, revoke.

A key is ``svc_`` + 32 hex characters, shown once at creation and stored only as its SHA-256
(the key is 128 random bits, so a fast hash is enough: nothing to brute-force). Called by the API
(``api/api_keys.py``, the auth hook) and the CLI (``agentauth keys create``).
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.domain import ids
from core.domain.clock import isoformat
from core.domain.errors import ApiKeyExpired, ApiKeyNotFound, Unauthorized
from core.domain.validation import require_name
from core.store.models import ApiKey, Workspace
from core.store.paging import Page, paginate

KEY_PATTERN = re.compile(r"svc_[0-9a-f]{32}")


class Scope(StrEnum):
    ADMIN = "admin"
    #: reads what read-only reads, and decides approvals (decisions §6)
    APPROVER = "approver"
    READ_ONLY = "read-only"


@dataclass(frozen=True, slots=True)
class KeyRow:
    """What authenticating a key needs of its row."""

    id: str
    workspace_id: str
    scopes: str
    expires_at: datetime | None
    revoked: bool


class KeyLookup(Protocol):
    """Finds a key's row by its hash (``core.hotpath.reads.Reads``, straight to the driver)."""

    def api_key(self, key_hash: str) -> KeyRow | None: ...


@dataclass(frozen=True)
class Principal:
    """Who is calling: the key's id, its workspace and scopes."""

    key_id: str
    workspace_id: str
    scopes: frozenset[Scope]

    def can(self, needed: Scope) -> bool:
        if needed is Scope.READ_ONLY or Scope.ADMIN in self.scopes:
            return True
        return needed is Scope.APPROVER and Scope.APPROVER in self.scopes


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("ascii")).hexdigest()


def ensure_workspace(session: Session, name: str, now: datetime) -> str:
    """The id of workspace ``name``, created on first use."""
    require_name(name, "workspace")
    wid = ids.workspace_id(name)
    if session.get(Workspace, wid) is None:
        session.add(Workspace(id=wid, name=name, created_at=now))
        session.flush()
    return wid


def issue_key(
    session: Session,
    workspace_id: str,
    name: str,
    scopes: list[str],
    expires_at: datetime | None,
    now: datetime,
) -> tuple[ApiKey, str]:
    """Create a key; returns the row and the full key (the only time it exists in clear)."""
    require_name(name, "name")  # the API's body was checked; the CLI's --name was not
    key = "svc_" + secrets.token_hex(16)
    row = ApiKey(
        id=ids.new_id(),
        workspace_id=workspace_id,
        name=name,
        prefix=key[:10],
        key_hash=hash_key(key),
        scopes=",".join(sorted(Scope(s).value for s in scopes)),
        expires_at=expires_at,
        created_at=now,
        revoked_at=None,
    )
    session.add(row)
    session.flush()
    return row, key


def presented_key(header: str | None) -> str | None:
    """The key an ``Authorization`` header presents, when it has a key's shape (nothing is
    looked up: a request without one can be refused before its body is read)."""
    scheme, _, key = (header or "").partition(" ")
    key = key.strip()
    return key if scheme.lower() == "bearer" and KEY_PATTERN.fullmatch(key) else None


def required_key(header: str | None) -> str:
    """The key an ``Authorization`` header presents, or Unauthorized when it presents none of
    a key's shape (nothing is looked up)."""
    if not header:
        raise Unauthorized("missing API key: send Authorization: Bearer <key>")
    key = presented_key(header)
    if key is None:
        raise Unauthorized("malformed API key: expected Authorization: Bearer svc_<32 hex>")
    return key


def authenticate(reads: KeyLookup, header: str | None, now: datetime) -> Principal:
    """The caller behind an ``Authorization: Bearer svc_...`` header, or Unauthorized /
    ApiKeyExpired. Runs on every request, hence a read straight through the driver."""
    row = reads.api_key(hash_key(required_key(header)))
    if row is None or row.revoked:
        raise Unauthorized("invalid or revoked API key")
    if row.expires_at is not None and row.expires_at <= now:
        raise ApiKeyExpired()
    return Principal(row.id, row.workspace_id, frozenset(Scope(s) for s in row.scopes.split(",")))


def list_keys(session: Session, workspace_id: str, limit: int, offset: int) -> Page[ApiKey]:
    query = (
        select(ApiKey)
        .where(ApiKey.workspace_id == workspace_id, ApiKey.revoked_at.is_(None))
        .order_by(ApiKey.created_at, ApiKey.id)
    )
    return paginate(session, query, limit, offset)


def get_key(session: Session, workspace_id: str, key_id: str) -> ApiKey:
    row = session.get(ApiKey, key_id)
    if row is None or row.workspace_id != workspace_id:
        raise ApiKeyNotFound()
    return row


def revoke_key(session: Session, workspace_id: str, key_id: str, now: datetime) -> None:
    row = session.get(ApiKey, ids.normalize_uuid(key_id))
    if row is None or row.workspace_id != workspace_id or row.revoked_at is not None:
        raise ApiKeyNotFound()
    row.revoked_at = now


def serialize_key(row: ApiKey, key: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": row.id,
        "name": row.name,
        "prefix": row.prefix,
        "scopes": row.scopes.split(","),
        "expiresAt": isoformat(row.expires_at) if row.expires_at else None,
        "createdAt": isoformat(row.created_at),
    }
    if key is not None:
        out["key"] = key
    return out
