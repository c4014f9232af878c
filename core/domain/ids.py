"""Identifiers: random UUIDs for API-created objects, time-ordered ones for audit entries, and
stable (UUIDv5) ones for workspaces and git-managed objects."""

from __future__ import annotations

import os
import re
import time
import uuid

#: Namespace of every derived id; changing it would change every git-managed object's id.
NAMESPACE = uuid.UUID("8f6b1c1e-3d1a-5b7e-9a0c-5f1d2e3c4b5a")


def new_id() -> str:
    """A random UUID (version 4)."""
    return str(uuid.uuid4())


def new_sortable_id() -> str:
    """A UUID version 7: milliseconds since the epoch first, so ids sort by creation time."""
    value = (time.time_ns() // 1_000_000) << 80 | int.from_bytes(os.urandom(10), "big")
    value &= ~(0xF << 76)
    value |= 0x7 << 76  # version
    value &= ~(0x3 << 62)
    value |= 0x2 << 62  # RFC 4122 variant
    return str(uuid.UUID(int=value))


def stable_id(*parts: str) -> str:
    """The same UUID (version 5) for the same parts, on every machine and database."""
    return str(uuid.uuid5(NAMESPACE, "/".join(parts)))


def workspace_id(name: str) -> str:
    return stable_id("workspace", name)


_CANONICAL = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)


def is_uuid(value: str) -> bool:
    """Whether ``value`` is a UUID in its canonical 8-4-4-4-12 form (as ``common.json`` says)."""
    return isinstance(value, str) and _CANONICAL.fullmatch(value) is not None


def normalize_uuid(value: str) -> str:
    """The canonical (lower-case) form; callers validate first."""
    return value.lower()
